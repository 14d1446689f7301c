"""What one person may have in flight on the render path: how many uploads they may begin in a while (a rate,
answered 429 with Retry-After), and how many jobs that have not ended they may have (uploads on their way count).

Each upload may hold PORTAL_RENDER_MAX_UPLOAD_BYTES and unpack to PORTAL_RENDER_MAX_UNPACKED_BYTES, so these two
bound what one person can put on the disk before any job of theirs ends (retention then removes ended jobs'
files). The rate is counted in Redis (the cache), per person and per fixed window, so every web process agrees.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache

from sessions.render.models import RenderJob, RenderUpload


class Refused(Exception):
    """An upload, or one part of it, not taken: ``status`` for the protocol, ``message`` for its owner."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


def open_jobs(owner: User) -> int:
    """Jobs of theirs that have not ended, and uploads of theirs that are not jobs yet."""
    jobs = RenderJob.objects.filter(owner=owner).exclude(state__in=RenderJob.ENDED).count()
    return jobs + RenderUpload.objects.filter(owner=owner).count()


def take_upload(owner: User) -> None:
    """Count one more upload begun by ``owner``; Refused (429 with Retry-After) past the rate, Refused (409) at
    the most open jobs a person may have."""
    window = settings.RENDER_UPLOAD_WINDOW_MINUTES * 60
    now = time.time()
    key = f"render-uploads:{owner.pk}:{int(now // window)}"
    cache.add(key, 0, timeout=window + 60)
    if cache.incr(key) > settings.RENDER_UPLOADS_PER_WINDOW:
        wait = max(1, int(window - now % window) + 1)
        raise Refused(
            429,
            f"You began {settings.RENDER_UPLOADS_PER_WINDOW} uploads in the last "
            f"{settings.RENDER_UPLOAD_WINDOW_MINUTES} minutes, the most a person may; try again in "
            f"{_duration(wait)}.",
            retry_after=wait,
        )
    found = open_jobs(owner)
    if found >= settings.RENDER_MAX_OPEN_JOBS:
        raise Refused(
            409,
            f"You have {found} render jobs that have not ended (uploads on their way count), the most a person "
            "may have: cancel one, or wait for one to end.",
        )


def _duration(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} seconds"
    return f"{round(seconds / 60)} minutes"
