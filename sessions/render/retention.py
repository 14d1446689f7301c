"""Retention: an ended job's files go PORTAL_RENDER_RETENTION_DAYS after it ended; its record stays. And expiry: a
job left waiting for its owner (its main file never chosen, its estimate never confirmed) for
PORTAL_RENDER_UNFINISHED_EXPIRY_HOURS is cancelled, saying why, and its files go.

Only the job's folder goes (its scene and unpacked assets, frames, thumbnails, estimate); the job's row,
its chunks' and frames' rows, its slices and every charge (usages, minutes, the ledger) are kept, and the
job notes when its files went (``files_removed_at``) so its pages say so. Each job is taken under its row's
lock, skipping one another run holds, so two runs at once remove each folder once; a job that has not
ended (a failed one queued again among them) is never touched, and no link is followed
(``sessions.render.files``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from sessions.render import jobs
from sessions.render.models import RenderJob

BATCH = 500  # jobs one run takes at most: the hourly task catches up on a backlog run by run


def expired(now: datetime) -> QuerySet[RenderJob]:
    """Ended jobs whose files are still there and that ended more than the retention ago."""
    cutoff = now - timedelta(days=settings.RENDER_RETENTION_DAYS)
    return RenderJob.objects.filter(state__in=RenderJob.ENDED, finished_at__lt=cutoff, files_removed_at__isnull=True)


def remove_expired_files(now: datetime | None = None) -> int:
    """Remove the files of every job past the retention (a batch at a time); returns how many jobs'."""
    now = now or timezone.now()
    due = list(expired(now).order_by("finished_at").values_list("pk", flat=True)[:BATCH])
    return sum(_remove_if_due(job_id, now) for job_id in due)


def remove_now(job_id: int) -> bool:
    """An ended job's files, removed before their time at its owner's (or an operator's) asking; False if they
    were gone already. BadStep for a job that has not ended: it is cancelled first."""
    with transaction.atomic():
        job = RenderJob.objects.select_for_update().get(pk=job_id)
        if not job.ended:
            raise RenderJob.BadStep(
                f"A job that is {job.get_state_display().lower()} keeps its files; cancel it first."
            )
        return job.files_removed_at is None and jobs.remove_files(job)


def _remove_if_due(job_id: int, now: datetime) -> bool:
    """Under the job's lock, if it is still due: another run holding it is skipped, not waited for."""
    with transaction.atomic():
        job = expired(now).select_for_update(skip_locked=True).filter(pk=job_id).first()
        return job is not None and jobs.remove_files(job)


# The states in which a job waits for its owner alone, and what it waited for.
WAITING_FOR = {
    RenderJob.State.UPLOADED: "its main file was not chosen",
    RenderJob.State.AWAITING_CONFIRMATION: "its estimate was not confirmed",
}


def unfinished(now: datetime) -> QuerySet[RenderJob]:
    """Jobs that have waited for their owner longer than the expiry since their last step."""
    cutoff = now - timedelta(hours=settings.RENDER_UNFINISHED_EXPIRY_HOURS)
    return RenderJob.objects.filter(state__in=list(WAITING_FOR), state_since__lt=cutoff)


def expire_unfinished(now: datetime | None = None) -> int:
    """Cancel every job that waited for its owner past the expiry (a batch at a time), its page saying why, and
    remove its files; returns how many."""
    now = now or timezone.now()
    due = list(unfinished(now).order_by("state_since").values_list("pk", flat=True)[:BATCH])
    return sum(_expire_if_due(job_id, now) for job_id in due)


def _expire_if_due(job_id: int, now: datetime) -> bool:
    """Under the job's lock, if it still waits (its owner may have acted meanwhile): another run holding it is
    skipped. Nothing of it runs on a slice in either state, so its files go at once."""
    with transaction.atomic():
        job = unfinished(now).select_for_update(skip_locked=True).filter(pk=job_id).first()
        if job is None:
            return False
        job.save(update_fields=job.move(RenderJob.State.CANCELLED, _expired_words(job), when=now))
    jobs.remove_files(job)
    return True


def _expired_words(job: RenderJob) -> str:
    hours = settings.RENDER_UNFINISHED_EXPIRY_HOURS
    waited = f"{hours // 24} day{'s' if hours != 24 else ''}" if hours % 24 == 0 else f"{hours} hours"
    return (
        f"Cancelled by the portal: {WAITING_FOR[RenderJob.State(job.state)]} within {waited}, so its files were "
        "removed. Upload the scene again to render it."
    )
