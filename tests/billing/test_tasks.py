"""The meter in a real Celery worker process: beat's minute task, and a session's end charged by name."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from billing import ledger, money
from billing.models import ChargedMinute, Usage
from billing.prices import database_now
from billing.tasks import charge_accrued
from sessions.gpus.allocator import holding_started
from sessions.notebooks.models import NotebookImage
from sessions.notebooks.services import CHARGE_HOLDING, ContainerEnd, container_ended
from tests.billing.conftest import Hold
from tests.factories import running_session
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_beat_ticks_the_meter_every_minute_and_drops_a_tick_the_next_one_overtakes() -> None:
    from portal.celery import app

    entry = app.conf.beat_schedule["billing-minute"]
    assert entry["task"] == charge_accrued.name and entry["schedule"] == 60.0
    assert entry["options"]["expires"] < 60
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
    holding_started(session.slice_id, started)
    container_ended(session.pk, ContainerEnd(at=started + timedelta(minutes=3, seconds=5), exit_code=0))
    closed = Usage.objects.filter(slice_id=session.slice_id, open=False)
    wait_for(closed.exists, 60, "the worker charging the ended holding")
    usage = Usage.objects.get(slice_id=session.slice_id)
    assert usage.billed_minutes == 4
    assert ledger.balance(alice) == -4 * money.per_minute(usage.price.per_hour)
