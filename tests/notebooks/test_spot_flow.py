"""A spot session reclaimed for an on-demand launch, with the real parts: portal -> Celery -> hub -> spawner -> Docker.

The spot session runs on the whole H200; an on-demand launch finds no room and waits; the spot session's
owner is told; after the grace time the worker's task stops it through the hub, the spawner reports its
container gone, and that end hands the slice's GPU to the waiting session, which starts and runs. The spot
session is charged at the spot rate, to spot revenue, up to the moment its container was gone.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from billing import ledger, meter, money, prices, seeds
from billing.models import Account, Market, Price, Usage
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Reclaim, Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session
from sessions.runtime.docker import DockerRuntime
from tests.billing.conftest import unbalanced_transactions
from tests.helpers.waiting import state_of, wait_for

pytestmark = [pytest.mark.hub, pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = NotebookSession.State


def test_a_spot_session_is_reclaimed_with_notice_then_stopped_and_the_on_demand_one_gets_the_gpu(
    hub: str,
    notebook_image: NotebookImage,
    alice: User,
    bob: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.SPOT_GRACE_SECONDS = 4  # the reclaim's due moment and its task's countdown are set by the launch
    seeds.ensure(Price)  # a transactional test before this one may have flushed the migration's rows
    spot = start_session(bob, Launch(SliceRequest("mig", "7g.141gb"), notebook_image.pk, "cheap", spot=True))
    wait_for(lambda: state_of(spot) == State.RUNNING, 120, "the spot session to run")
    assert spot.slice is not None and spot.slice.market == Slice.Market.SPOT
    runtime = DockerRuntime()
    assert len(runtime.containers_for("session", str(spot.pk))) == 1

    waiting = start_session(alice, Launch(SliceRequest("mig", "3g.71gb"), notebook_image.pk, "urgent"))
    assert waiting.state == State.ALLOCATING
    spot.refresh_from_db()
    assert spot.state == State.RUNNING and "reclaimed for an on-demand session" in spot.warning  # the notice

    wait_for(lambda: state_of(spot) == State.PREEMPTED, 90, "the spot session to be preempted")
    assert spot.ended_reason == NotebookSession.EndReason.PREEMPTED
    assert runtime.containers_for("session", str(spot.pk)) == []
    held = Slice.objects.get(pk=spot.slice.pk)
    assert spot.container_gone_at is not None and spot.warned_at is not None
    assert not held.active and held.held_until == spot.container_gone_at  # billed up to its end
    assert spot.container_gone_at - spot.warned_at >= timedelta(seconds=4)  # it had its grace time

    closed = Usage.objects.filter(slice_id=held.pk, open=False)
    wait_for(closed.exists, 60, "the spot session charged to its end")
    usage = closed.get()
    assert usage.market == Market.SPOT and usage.ended == spot.container_gone_at
    assert usage.billed_minutes == meter.minutes_due(usage.started, usage.ended, usage.ended)
    spot_price = prices.in_force(prices.key_of(held, Market.SPOT), usage.started)
    assert spot_price is not None and usage.per_minute == money.per_minute(spot_price.per_hour)
    assert ledger.balance(bob) == -usage.billed_minutes * usage.per_minute  # at the spot rate, every minute once
    assert ledger.account_balance(Account.Kind.REVENUE_SPOT) == usage.billed_minutes * usage.per_minute
    assert unbalanced_transactions() == []

    wait_for(lambda: state_of(waiting) == State.RUNNING, 120, "the on-demand session to run on the freed GPU")
    assert waiting.slice is not None and waiting.slice.gpu_id == held.gpu_id
    assert waiting.slice.market == Slice.Market.ON_DEMAND
    assert Reclaim.objects.get(waiting_id=waiting.pk).state == Reclaim.State.HANDED_OVER
    [container_id] = runtime.containers_for("session", str(waiting.pk))
    env = runtime.run_in(container_id, ["sh", "-c", "tr '\\0' '\\n' < /proc/1/environ"])
    assert f"NVIDIA_VISIBLE_DEVICES={waiting.slice.device_uuid}" in env.splitlines()
