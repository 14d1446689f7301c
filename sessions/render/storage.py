"""The render path's share of each person's storage quota (``sessions.storage``), and the checks where its bytes
come in.

Each job's folder is measured by part (its scene and estimate; its frames and thumbnails) when its files change:
once it is recorded, unpacked, after each chunk's run, and it is forgotten when they are removed; a periodic
measure catches the rest. An upload on its way counts at its declared length from its start. Where bytes come
in: an upload's start is refused past the quota, a zip's unpacking is refused on the form, and a chunk's output
watchdog stops a run at what is left of the quota (or PORTAL_RENDER_MAX_OUTPUT_BYTES, whichever is less).
Measuring never follows a link and trusts nothing the sandbox wrote (``sessions.runtime.watchdogs``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import CharField
from django.db.models.functions import Cast
from django.urls import reverse

from sessions.render import files
from sessions.render.limits import Refused
from sessions.render.models import RenderJob, RenderUpload
from sessions.render.scenefile import SceneRefused
from sessions.runtime.watchdogs import ENTRY_BYTES, folder_bytes, size_words
from sessions.storage import shown, usage
from sessions.storage.models import StorageUse

log = logging.getLogger(__name__)
Kind = StorageUse.Kind
FRAME_FOLDERS = frozenset({"frames", "thumbnails"})  # the rest of a job's folder is its scene's part


def job_parts(job: RenderJob) -> dict[str, int] | None:
    """What the job's folder holds on disk, as its scene and its frames; None if it has no folder (or one
    reached through a link, which is never walked)."""
    root, folder = Path(settings.RENDER_DIR), job.folder_path()
    if not os.path.lexists(folder):
        return None
    if not files.inside(root, folder):
        log.error("not measuring %s: it is not a folder inside %s", folder, root)
        return None
    parts = {"scene": 0, "frames": 0}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                parts["frames" if entry.name in FRAME_FOLDERS else "scene"] += _entry_bytes(entry)
    except FileNotFoundError:
        return None
    return parts


def _entry_bytes(entry: os.DirEntry[str]) -> int:
    """One entry of a job's folder with all it holds, counted as the output watchdog counts."""
    try:
        info = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return 0
    own = max(ENTRY_BYTES, info.st_size, info.st_blocks * 512)
    return own + (folder_bytes(Path(entry.path)) if entry.is_dir(follow_symlinks=False) else 0)


def measure_job(job: RenderJob) -> None:
    """Measure the job's folder again and record it (forgotten once its files are gone)."""
    parts = job_parts(job)
    removed = RenderJob.objects.filter(pk=job.pk, files_removed_at__isnull=False).exists()
    if parts is None or removed:
        usage.forget(Kind.RENDER_JOB, str(job.pk))
        return
    _record_job(job, parts)


def _record_job(job: RenderJob, parts: dict[str, int]) -> None:
    usage.record(
        job.owner_id,
        Kind.RENDER_JOB,
        str(job.pk),
        label=job.upload_name,
        size=sum(parts.values()),
        parts=parts,
        url=reverse("render-job-detail", args=[job.pk]),
    )


def files_gone(job: RenderJob) -> None:
    usage.forget(Kind.RENDER_JOB, str(job.pk))


def check_upload(owner: User, length: int) -> None:
    """Refused (413, in words) if an upload of ``length`` bytes would pass the person's quota. Holds the person's
    row until the caller's transaction ends, in which the upload is recorded with ``reserve_upload``."""
    usage.lock(owner)
    found = usage.usage_of(owner)
    if found.used + length > found.limit:
        raise Refused(
            413, f"This upload of {size_words(length)} would pass your storage quota. {_and_what_to_do(found)}."
        )


def reserve_upload(upload: RenderUpload) -> None:
    """An upload on its way counts at its declared length from its start, before a byte of it arrives."""
    usage.record(
        upload.owner_id,
        Kind.UPLOAD,
        upload.token,
        label=upload.name,
        size=upload.length,
        url=reverse("render-job-list"),
    )


def upload_gone(upload: RenderUpload) -> None:
    usage.forget(Kind.UPLOAD, upload.token)


def check_unpacking(owner: User, upload: RenderUpload, unpacked: int) -> None:
    """SceneRefused (code ``quota``; its upload is kept) if the zip's entries, which lie beside it on the disk
    while they are unpacked, would pass the person's quota."""
    if not unpacked:
        return
    usage.lock(owner)
    found = usage.usage_of(owner)  # the upload itself counts already, at its length
    if found.used + unpacked > found.limit:
        raise SceneRefused(
            f"{upload.name} unpacks to {size_words(unpacked)}, which would pass your storage quota. "
            f"{_and_what_to_do(found)}; then send this form again (your upload is kept).",
            "quota",
        )


def job_recorded(upload: RenderUpload, job: RenderJob, unpacked: int) -> None:
    """The upload became the job: its share is the upload's, and what its zip will unpack to, until it is
    unpacked and measured."""
    usage.forget(Kind.UPLOAD, upload.token)
    _record_job(job, {"scene": upload.length + unpacked, "frames": 0})


@dataclass(frozen=True)
class OutputBound:
    """What one run of a chunk may write: what is left of its owner's quota, or PORTAL_RENDER_MAX_OUTPUT_BYTES
    if that is less. Several of a person's chunks that run at once may each write up to what was left."""

    limit: int
    found: usage.Usage

    @property
    def by_quota(self) -> bool:
        return self.limit < settings.RENDER_MAX_OUTPUT_BYTES

    def exceeded(self) -> str:
        """Why the run was stopped (or never started), when the quota was its bound."""
        if self.limit <= 0:
            why = "the render would pass your storage quota, which your files fill already"
        else:
            why = (
                f"the render would pass your storage quota (it was stopped at {size_words(self.limit)}, what was "
                "left of your quota)"
            )
        return f"{why}. {_and_what_to_do(self.found)}; then queue the frames that are not done again"


def output_bound(owner_id: int) -> OutputBound:
    found = usage.usage_of(User.objects.get(pk=owner_id))
    return OutputBound(min(settings.RENDER_MAX_OUTPUT_BYTES, found.left), found)


def _and_what_to_do(found: usage.Usage) -> str:
    return f"{shown.used_words(found)}. To make room, {shown.REMOVE}"


def measure_all() -> int:
    """The periodic measure: every job whose files are there, unless it ended before it was last measured
    (nothing writes to an ended job's folder); rows of jobs whose files went and of uploads that are gone are
    forgotten, and an upload without its reservation gets one. Returns how many jobs it measured."""
    last = dict(StorageUse.objects.filter(kind=Kind.RENDER_JOB).values_list("key", "measured_at"))
    with_files = RenderJob.objects.filter(files_removed_at__isnull=True)
    measured = 0
    for job in with_files.only("owner_id", "folder", "upload_name", "state", "finished_at").iterator():
        at = last.get(str(job.pk))
        if at is None or not job.ended or job.finished_at is None or job.finished_at >= at:
            measure_job(job)
            measured += 1
    usage.forget_all_but(Kind.RENDER_JOB, with_files.annotate(key=Cast("pk", CharField())).values("key"))
    usage.forget_all_but(Kind.UPLOAD, RenderUpload.objects.values("token"))
    reserved = StorageUse.objects.filter(kind=Kind.UPLOAD).values("key")
    for upload in RenderUpload.objects.exclude(token__in=reserved):
        reserve_upload(upload)
    return measured
