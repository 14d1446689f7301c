"""Celery tasks of render jobs: thin, idempotent, calling sessions.render.jobs."""

from __future__ import annotations

from celery import shared_task

from sessions.render.jobs import remove_orphan_folders


@shared_task
def remove_orphan_uploads() -> int:
    """Hourly: remove what uploads cut off by a crash left on disk (folders no job owns, long untouched)."""
    return remove_orphan_folders()
