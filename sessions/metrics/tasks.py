"""Celery tasks of the GPU metrics: thin, idempotent, calling sessions.metrics.history."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from sessions.metrics.history import delete_older_than


@shared_task
def prune_gpu_history() -> int:
    """Hourly: delete per-minute GPU history older than PORTAL_METRICS_RETENTION_DAYS."""
    return delete_older_than(settings.METRICS_RETENTION_DAYS)
