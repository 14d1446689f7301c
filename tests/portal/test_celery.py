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
