"""The zero-balance stop with the real parts: portal -> Celery -> JupyterHub -> spawner -> Docker, and back.

A real notebook session runs on an H200 slice; its credit runs out at a meter tick; its owner is warned
(over the websocket, through the real daphne, and on the dashboard); the grace time passes on a controlled
clock; the zero-balance check stops the session through the hub; the spawner reports the container's end
as the engine recorded it, and the worker's end-of-holding charge bills every started minute up to it.

The clock: the meter counts minutes from the recorded moments by the database's clock, so minutes passing
look to it like the recorded start lying further back (``minutes_pass``, as tests/billing/conftest.py's
``clock_moves_on``); the check's own clock is its ``now``. The end moment is never moved: it is Docker's.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal

import pytest
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from billing import costs, credit, ledger, meter, seeds
from billing.models import ChargedMinute, CreditStop, Price, Usage
from portal.clock import database_now
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session
from sessions.runtime.docker import DockerRuntime
from tests.billing.conftest import ledger_total, unbalanced_transactions
from tests.helpers.waiting import state_of, wait_for
from tests.helpers.websockets import session_cookie

pytestmark = [pytest.mark.hub, pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = NotebookSession.State
CENT = Decimal("0.01")


def minutes_pass(session: NotebookSession, seconds: int) -> None:
    """``seconds`` pass as the meter sees it: the session's recorded start lies that much further back."""
    step = timedelta(seconds=seconds)
    assert session.slice_id is not None
    NotebookSession.objects.filter(pk=session.pk).update(container_started_at=F("container_started_at") - step)
    Slice.objects.filter(pk=session.slice_id).update(held_from=F("held_from") - step)
    Usage.objects.filter(slice_id=session.slice_id).update(started=F("started") - step)


def held_from(session: NotebookSession) -> datetime:
    assert session.slice_id is not None
    moment = Slice.objects.get(pk=session.slice_id).held_from
    assert moment is not None
    return moment


def next_notice(socket: ClientConnection, kind: str, timeout: float = 10) -> dict[str, object]:
    """The next notice of this kind on a notification socket (others, such as session changes, are skipped)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = json.loads(socket.recv(timeout=left))
        except TimeoutError:
            break
        if message.get("type") == kind:
            return dict(message)
    raise AssertionError(f"no {kind!r} notice arrived within {timeout} s")


def dashboard_of(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.get(reverse("dashboard")).content.decode()


def test_at_zero_balance_a_real_session_is_warned_then_stopped_through_the_hub_and_charged_to_its_end(
    hub: str,
    portal_server: str,
    notebook_image: NotebookImage,
    alice: User,
    staff: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.BILLING_GRACE_MINUTES = 1
    seeds.ensure(Price)  # a transactional test before this one may have flushed the migration's rows
    session = start_session(alice, Launch(SliceRequest("mig", "3g.71gb"), notebook_image.pk, "broke"))
    wait_for(lambda: state_of(session) == State.RUNNING, 120, "the session to run")
    runtime = DockerRuntime()
    assert len(runtime.containers_for("session", str(session.pk))) == 1
    started = session.container_started_at
    assert started is not None and session.slice is not None
    rate = costs.per_minute_of(session.slice)
    assert rate is not None and rate > 0
    ledger.grant_credit(alice, (2 * rate).quantize(CENT, rounding=ROUND_DOWN), by=staff, reason="trial")
    assert credit.check_balances() == {"warned": 0, "stopped": 0, "cleared": 0}  # credit left: nothing happens

    url = portal_server.replace("http://", "ws://") + "/ws/notifications/"
    with connect(url, origin=Origin(portal_server), additional_headers={"Cookie": session_cookie(alice)}) as socket:
        # 90 s since its start as the meter sees it, however long the start took: minutes 0 and 1 have begun,
        # together more than the credit.
        minutes_pass(session, 90 - int((database_now() - held_from(session)).total_seconds()))
        assert meter.tick().minutes == 2
        assert ledger.balance(alice) < 0
        warned_at = timezone.now()
        assert credit.check_balances(warned_at) == {"warned": 1, "stopped": 0, "cleared": 0}
        warning = next_notice(socket, "billing.zero_balance")
        assert "will be stopped at" in str(warning["text"])
        page = dashboard_of(alice)
        assert 'data-testid="zero-balance"' in page and "Your credit has run out" in page
        assert CreditStop.objects.get(user=alice).stop_at == warned_at + timedelta(minutes=1)

        minutes_pass(session, 60)  # the grace time, on both clocks
        assert credit.check_balances(warned_at + timedelta(seconds=59))["stopped"] == 0
        assert state_of(session) == State.RUNNING
        assert credit.check_balances(warned_at + timedelta(minutes=1))["stopped"] == 1
        assert (
            next_notice(socket, "billing.credit_stop")["text"]
            == "Your credit has run out: your sessions and render jobs are being stopped."
        )

    wait_for(lambda: state_of(session) == State.STOPPED, 90, "the hub to stop the session")
    assert session.ended_reason == NotebookSession.EndReason.CREDIT
    assert runtime.containers_for("session", str(session.pk)) == []  # really gone in Docker
    gone = session.container_gone_at
    died = runtime.died_at(session.pk, since=started)
    assert gone is not None and died is not None and session.ended_at is not None
    assert abs(gone - died) < timedelta(milliseconds=250), (gone, died)  # the engine's moment, not the portal's
    assert gone < session.ended_at

    held = Slice.objects.get(pk=session.slice.pk)
    assert held.held_until == gone and not held.active
    wait_for(lambda: Usage.objects.filter(slice=held, open=False).exists(), 60, "the worker to charge the end")
    usage = Usage.objects.get(slice=held)
    assert held.held_from is not None and usage.ended == gone
    due = meter.minutes_due(held.held_from, gone, gone)
    assert due == 3  # 150 s and the few the stop took: the end's partial third minute, charged at the end
    minutes = list(ChargedMinute.objects.filter(usage=usage).order_by("minute").values_list("minute", flat=True))
    assert minutes == list(range(due)) and usage.billed_minutes == due  # each started minute, once
    assert meter.tick().minutes == 0 and meter.charge_holding(held.pk).minutes == 0  # nothing left, nothing twice
    assert ledger.balance(alice) == (2 * rate).quantize(CENT, rounding=ROUND_DOWN) - due * rate
    assert unbalanced_transactions() == [] and ledger_total() == 0
    assert "your sessions and render jobs were stopped" in dashboard_of(alice)
