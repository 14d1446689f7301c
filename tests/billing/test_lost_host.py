"""Billing stops at a lost host's last heartbeat (issue 31, item 3).

While a host is lost its holdings are not charged past its last heartbeat; when its agent is back and its
engine reports the containers' real ends (or that they still run), the holdings settle to those; a host that
never returns ends its holdings at the last heartbeat, and their owners read why.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db.models import F

from billing import ledger, meter
from billing.models import ChargedMinute
from sessions.gpus import holdings, hosts
from sessions.gpus.hosts import Node
from sessions.gpus.models import Gpu, GpuHost, Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.billing.conftest import A100, Hold, clock_moves_on, ledger_total, unbalanced_transactions
from tests.billing.test_settle_to_true_end import A100_MINUTE
from tests.factories import running_session

pytestmark = pytest.mark.django_db
AGENT = Node("bill-machine", 16, 65536)


def charged(held_id: int) -> list[int]:
    return sorted(ChargedMinute.objects.filter(usage__slice_id=held_id).values_list("minute", flat=True))


def time_passes(minutes: float, agent_beats: bool) -> None:
    """``minutes`` pass: the engine is asked all along (the containers run), the agent beats or is silent."""
    clock_moves_on(minutes)
    GpuHost.objects.update(heartbeat_at=F("heartbeat_at") - timedelta(minutes=minutes))
    if agent_beats:
        hosts.heartbeat("bill", "simulated", AGENT)


def test_a_lost_host_is_not_charged_past_its_last_heartbeat_and_settles_to_the_real_end_once_back(
    hold: Hold, alice: User
) -> None:
    hosts.heartbeat("bill", "simulated", AGENT)
    held = hold(alice, timedelta(minutes=1, seconds=30))
    assert meter.tick().minutes == 2
    time_passes(10, agent_beats=False)  # the agent died ten minutes ago; the engine says the container runs
    assert hosts.watch()["lost"] == ["bill"]
    heartbeat = GpuHost.objects.get(name="bill").heartbeat_at
    assert Slice.objects.get(pk=held.pk).seen_at == heartbeat  # the engine's word past it is taken back
    assert holdings.seen([held.pk]) == 0  # and no more is taken while the host is lost
    assert meter.tick().minutes == 0
    assert charged(held.pk) == [0, 1]
    # The agent is back; the engine reports the container's real end: 6 min 1 s after it started.
    hosts.heartbeat("bill", "simulated", AGENT)
    assert GpuHost.objects.get(name="bill").state == GpuHost.State.UP
    held.refresh_from_db()
    assert held.held_from is not None
    holdings.ended(held.pk, held.held_from, held.held_from + timedelta(minutes=6, seconds=1))
    assert meter.charge_holding(held.pk).minutes == 5
    assert charged(held.pk) == list(range(7)) and ledger.balance(alice) == -7 * A100_MINUTE
    assert ledger_total() == 0 and unbalanced_transactions() == []


def test_a_lost_host_back_with_its_containers_still_running_charges_the_minutes_they_ran(
    hold: Hold, alice: User
) -> None:
    hosts.heartbeat("bill", "simulated", AGENT)
    held = hold(alice, timedelta(minutes=1, seconds=30))
    meter.tick()
    time_passes(10, agent_beats=False)
    hosts.watch()
    assert meter.tick().minutes == 0
    hosts.heartbeat("bill", "simulated", AGENT)
    assert holdings.seen([held.pk]) == 1  # the engine, asked again: the same container still runs
    assert meter.tick().minutes == 10
    assert charged(held.pk) == list(range(12))


def test_a_host_that_never_returns_ends_its_holdings_at_its_last_heartbeat_with_a_reason_people_see(  # type: ignore[no-untyped-def]
    fleet: list[Gpu], alice: User, settings
) -> None:
    hosts.heartbeat("bill", "simulated", AGENT)
    image, _ = NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "gpu-portal/notebook:latest"})
    session = running_session(alice, image, A100, "lost")
    assert session.slice is not None and session.container_started_at is not None
    holdings.started(session.slice.pk, session.container_started_at - timedelta(minutes=2, seconds=30))
    holdings.seen([session.slice.pk])
    assert meter.tick().minutes == 3
    time_passes(settings.HOST_GIVE_UP_AFTER_S / 60 + 5, agent_beats=False)
    assert hosts.watch() == {"lost": ["bill"], "given_up": ["bill"]}  # silent for longer than both bounds
    heartbeat = GpuHost.objects.get(name="bill").heartbeat_at
    ended = Slice.objects.get(pk=session.slice.pk)
    assert ended.held_until == heartbeat
    session.refresh_from_db()
    assert session.state in (NotebookSession.State.STOPPING, NotebookSession.State.STOPPED)
    assert session.get_ended_reason_display() == "Its GPU host stopped answering"
    meter.charge_holding(ended.pk)
    assert charged(ended.pk) == [0, 1, 2]  # the minutes up to the last heartbeat, none of the hour after
    assert ledger_total() == 0 and unbalanced_transactions() == []
    assert hosts.watch() == {"lost": [], "given_up": []}  # once
