"""Celery tasks of the portal itself: thin, id-taking, idempotent."""

from __future__ import annotations

from celery import shared_task

from portal.models import WorkerHeartbeat


@shared_task
def record_heartbeat(name: str = "celery") -> str:
    """Beat sends this every minute; the dashboard shows staff a worker that went quiet."""
    heartbeat = WorkerHeartbeat.beat(name)
    return heartbeat.seen_at.isoformat()
