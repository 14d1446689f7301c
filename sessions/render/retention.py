"""Retention: an ended job's files go PORTAL_RENDER_RETENTION_DAYS after it ended; its record stays.

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


def _remove_if_due(job_id: int, now: datetime) -> bool:
    """Under the job's lock, if it is still due: another run holding it is skipped, not waited for."""
    with transaction.atomic():
        job = expired(now).select_for_update(skip_locked=True).filter(pk=job_id).first()
        return job is not None and jobs.remove_files(job)
