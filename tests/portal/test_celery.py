"""A task runs in a real Celery worker process through the Redis broker."""

from __future__ import annotations

import pytest

from portal.models import WorkerHeartbeat
from portal.tasks import record_heartbeat

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_a_worker_process_runs_the_heartbeat_task_against_the_database(celery_worker: str) -> None:
    result = record_heartbeat.delay("worker-under-test")
    seen_at = result.get(timeout=30)
    heartbeat = WorkerHeartbeat.objects.get(name="worker-under-test")
    assert heartbeat.seen_at.isoformat() == seen_at
    assert result.successful()
    assert not heartbeat.is_stale()


def test_tasks_are_not_run_eagerly_in_the_calling_process() -> None:
    from portal.celery import app

    assert app.conf.task_always_eager is False
    assert app.conf.broker_url.startswith("redis://")


def test_the_beat_schedule_sends_the_heartbeat_every_minute() -> None:
    from portal.celery import app

    entry = app.conf.beat_schedule["portal-heartbeat"]
    assert entry["task"] == "portal.tasks.record_heartbeat"
    assert entry["schedule"] == 60.0
    assert "portal.tasks.record_heartbeat" in app.tasks


def test_no_beat_entry_carries_an_expiry_a_worker_whose_clock_runs_ahead_would_misread() -> None:
    """Beat stamps an expiry by its clock and the worker checks it by its own: a worker ahead drops them all."""
    from portal.celery import app

    expiring = [name for name, entry in app.conf.beat_schedule.items() if "expires" in entry.get("options", {})]
    assert expiring == []


@pytest.mark.celery
def test_the_worker_finds_every_task_beat_sends_and_the_start_the_services_enqueue(celery_worker: str) -> None:
    """Tasks live beside their services (sessions/notebooks/tasks.py ...): the worker process must find
    them all, or beat's entries and the services' by-name start would go nowhere."""
    from portal.celery import app
    from sessions.notebooks.services import START_NOTEBOOK

    registered = app.control.inspect(destination=[celery_worker], timeout=10).registered() or {}
    names = set(registered.get(celery_worker, []))
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert scheduled | {START_NOTEBOOK} <= names, f"not registered in the worker: {scheduled - names}"
