"""The periodic measure of everyone's storage (beat, every PORTAL_STORAGE_MEASURE_MINUTES)."""

from __future__ import annotations

from celery import shared_task

from sessions.storage import usage


@shared_task
def measure_storage() -> int:
    """Each part's things measured again (render jobs' folders, uploads' reservations, work volumes, notebook
    containers' writable layers); returns how many were measured."""
    return usage.measure_everything()
