"""The meter in a real Celery worker process: beat's minute task sent by two real beat schedulers at once and
caught up after an outage, charged by a worker whose clock runs minutes ahead of beat's (libfaketime), and a
session's end charged by name."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from billing import ledger, meter, money
from billing.models import ChargedMinute, CreditStop, Usage
from billing.tasks import charge_accrued, check_credit
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.holdings import CHARGE_HOLDING
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage
from sessions.notebooks.services import ContainerEnd, container_ended
from tests.billing.conftest import Hold, clock_moves_on, unbalanced_transactions
from tests.factories import running_session
from tests.helpers import processes
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_beat_ticks_the_meter_every_minute_and_checks_credit_with_no_expiry_a_skewed_clock_could_misread() -> None:
    from portal.celery import app

    entry, checks = app.conf.beat_schedule["billing-minute"], app.conf.beat_schedule["billing-credit"]
    assert entry["task"] == charge_accrued.name and entry["schedule"] == 60.0
    assert checks["task"] == check_credit.name and checks["schedule"] == 30.0
    assert "expires" not in entry.get("options", {}) and "expires" not in checks.get("options", {})
    assert CHARGE_HOLDING in app.tasks


def test_a_worker_process_charges_the_accrued_minutes(celery_worker: str, hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=5, seconds=30))
    summary = charge_accrued.delay().get(timeout=60)
    assert summary["minutes"] == 6 and summary["skipped"] is False
    assert ChargedMinute.objects.filter(usage__slice=held).count() == 6
    assert charge_accrued.delay().get(timeout=60)["minutes"] == 0


def test_a_sessions_end_is_charged_to_its_last_minute_without_waiting_for_a_tick(
    celery_worker: str, notebook_image: NotebookImage, alice: User
) -> None:
    from billing import seeds
    from billing.models import Price
    from sessions.gpus.allocator import SliceRequest

    seeds.ensure(Price)
    session = running_session(alice, notebook_image, SliceRequest(kind="whole", model="L4"), "lab")
    assert session.slice_id is not None
    started = database_now() - timedelta(minutes=3, seconds=40)
    session.container_started_at = started
    session.save(update_fields=["container_started_at"])
    holdings.started(session.slice_id, started)
    container_ended(session.pk, ContainerEnd(at=started + timedelta(minutes=3, seconds=5), exit_code=0))
    closed = Usage.objects.filter(slice_id=session.slice_id, open=False)
    wait_for(closed.exists, 60, "the worker charging the ended holding")
    usage = Usage.objects.get(slice_id=session.slice_id)
    assert usage.billed_minutes == 4
    assert ledger.balance(alice) == -4 * money.per_minute(usage.price.per_hour)


def charged_as_due(usage: Usage) -> bool:
    """Every minute due by the database's clock (and the holding's last proof of life) is charged, each once,
    and the wallet paid exactly those."""
    usage.refresh_from_db()
    minutes = list(ChargedMinute.objects.filter(usage=usage).order_by("minute").values_list("minute", flat=True))
    due = meter.minutes_due(usage.started, None, database_now(), Slice.objects.get(pk=usage.slice_id).seen_at)
    return minutes == list(range(due)) and ledger.balance(usage.owner) == -due * usage.per_minute


def sent(folder: Path, beat: int) -> int:
    """How many ticks a beat process has sent, by its log."""
    return (folder / f"beat-{beat}" / "beat.log").read_text(errors="replace").count("billing.tasks.charge_accrued")


def test_two_real_beat_schedulers_charge_each_minute_once_and_the_next_tick_catches_up_an_outage(
    celery_worker: str, hold: Hold, alice: User, tmp_path: Path
) -> None:
    held = hold(alice, timedelta(minutes=5, seconds=5))
    beats = [processes.start_billing_beat(1.0, tmp_path / f"beat-{n}") for n in (1, 2)]  # two schedulers at once
    try:
        wait_for(lambda: Usage.objects.filter(slice=held).exists(), 60, "beat's first tick opening the usage")
        usage = Usage.objects.get(slice=held)
        wait_for(lambda: min(sent(tmp_path, 1), sent(tmp_path, 2)) >= 3, 60, "both schedulers sending ticks")
        wait_for(lambda: charged_as_due(usage), 60, "the six started minutes charged")
        assert ChargedMinute.objects.filter(usage=usage).count() >= 6 and not unbalanced_transactions()
    finally:
        for beat in beats:
            processes.stop(beat)

    with transaction.atomic():
        clock_moves_on(10)  # beat is down for ten minutes
    charged_before = ChargedMinute.objects.filter(usage=usage).count()
    beat = processes.start_billing_beat(1.0, tmp_path / "beat-3")
    try:
        wait_for(lambda: charged_as_due(usage), 60, "the next tick charging the ten minutes of the outage")
        assert ChargedMinute.objects.filter(usage=usage).count() >= charged_before + 10
    finally:
        processes.stop(beat)
    assert not unbalanced_transactions()


LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")  # Debian's faketime


def test_a_worker_whose_clock_runs_minutes_ahead_of_beats_charges_and_stops_by_the_databases_clock(
    hold: Hold,
    alice: User,
    tmp_path: Path,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    """Beat stamps a task's expiry by its own clock and the worker reads it by its own: no tick or credit
    check may carry one, or a worker ahead of beat drops them all and running sessions are never charged or
    stopped at zero. What the worker does goes by the database's clock: the minutes, the zero-balance warning
    and its grace time."""
    assert LIBFAKETIME.exists(), "compose/bin/test installs Debian's faketime"
    queue = f"skewed-{uuid.uuid4().hex[:8]}"  # this worker's own: the run's worker never takes its ticks
    ahead = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": "+3m", "PORTAL_CELERY_QUEUE": queue}
    held = hold(alice, timedelta(minutes=2, seconds=5))
    worker = processes.start_celery_worker(f"{queue}@127.0.0.1", tmp_path / "worker.log", **ahead)
    entries = ("billing-minute", "billing-credit")
    beat = processes.start_billing_beat(1.0, tmp_path / "beat", entries, PORTAL_CELERY_QUEUE=queue)
    try:
        wait_for(lambda: Usage.objects.filter(slice=held).exists(), 60, "the skewed worker opening the usage")
        usage = Usage.objects.get(slice=held)
        wait_for(lambda: charged_as_due(usage), 60, "every minute due by the database's clock charged")
        wait_for(CreditStop.objects.filter(user=alice).exists, 60, "the skewed worker's zero-balance warning")
    finally:
        processes.stop(beat)
        processes.stop(worker)
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert "Discarding revoked" not in log and "succeeded" in log
    assert ChargedMinute.objects.filter(usage=usage).count() < 6  # not the 5 minutes the worker's clock says
    stop = CreditStop.objects.get(user=alice)
    assert abs(stop.warned_at - database_now()) < timedelta(minutes=1)  # not 3 minutes ahead
    assert stop.stop_at - stop.warned_at == timedelta(minutes=settings.BILLING_GRACE_MINUTES)
    assert stop.stopped_at is None  # the grace time has not passed by the database's clock
    assert not unbalanced_transactions()
