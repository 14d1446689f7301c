"""The render job services up to the estimate: a complete upload becomes a job (which a task then unpacks,
sessions/render/unpacking.py), its owner picks the main file of a zip that holds several, and a job that has not
been queued yet is cancelled.

Only these functions (and the later steps' services) change a job; each takes the row's lock, moves
it through ``RenderJob.move`` and saves the fields that step wrote.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from portal.celery import send_on_commit
from sessions.gpus.allocator import SliceRequest
from sessions.render import files, scenefile, storage
from sessions.render.models import RenderJob, RenderUpload
from sessions.render.scenefile import SceneRefused, ZipLimits, size_words
from sessions.render.uploads import discard, remove_folder, stored_path

State = RenderJob.State
UNPACK_JOB = "sessions.render.tasks.unpack_job"


@dataclass(frozen=True)
class JobChoices:
    """What the upload form asked for, already checked."""

    frame_spec: str
    frames: tuple[int, ...]
    resolution_percent: int
    samples: int | None
    output_format: str
    request: SliceRequest
    market: str
    chunk_size: int
    max_slices: int
    main_file: str = ""  # inside a zip that holds several .blend files; empty: ask once it is unpacked


def zip_limits() -> ZipLimits:
    return ZipLimits(
        settings.RENDER_MAX_ZIP_ENTRIES, settings.RENDER_MAX_UNPACKED_BYTES, settings.RENDER_MAX_COMPRESSION_RATIO
    )


def create_job(owner: User, token: str, sha256: str, choices: JobChoices) -> RenderJob:
    """Turn one of the person's complete uploads into a job that waits to be unpacked, once every byte is the one
    the browser hashed and a first look (the .blend's header, the zip's directory, each read in a moment) finds
    a scene. SceneRefused otherwise: its files go, except for an upload that is not complete yet (it resumes).
    The unpacking itself (a Celery task, ``sessions.render.unpacking``) reads the rest."""
    with transaction.atomic():
        upload = RenderUpload.objects.select_for_update().filter(owner=owner, token=token).first()
        if upload is None:
            raise SceneRefused(
                "The upload is gone (cancelled, or kept too long unused); upload the file again.", "gone"
            )
        if not upload.complete:
            raise SceneRefused(
                f"Only {size_words(upload.offset)} of {size_words(upload.length)} of '{upload.name}' arrived; "
                "let the upload finish.",
                "incomplete",
            )
        try:
            blend_files, unpacked = _first_look(upload, sha256, choices.main_file)
        except SceneRefused as refused:
            refusal = refused
        else:
            storage.check_unpacking(owner, upload, unpacked)  # refused: the upload is kept, to send again later
            return _recorded(owner, upload, blend_files, unpacked, choices)
    discard(upload)
    raise refusal


def _first_look(upload: RenderUpload, sha256: str, wanted: str) -> tuple[list[str], int]:
    """The checks quick enough for a request: the hash, then the .blend's header or the zip's directory (at most
    PORTAL_RENDER_MAX_ZIP_ENTRIES entries, their sizes and compression ratios). Returns the zip's .blend files and
    what its entries hold unpacked (nothing for a .blend)."""
    if not hmac.compare_digest(upload.sha256, sha256.lower()):
        raise SceneRefused(
            f"What arrived of '{upload.name}' is not the file you chose (its SHA-256 differs: the file changed, or "
            "it was damaged on its way); upload it again.",
            "sha256",
        )
    if upload.kind == "blend":
        scenefile.check_blend_header(stored_path(upload), upload.name)
        return [], 0
    found = scenefile.check_zip(stored_path(upload), zip_limits())
    if wanted and wanted not in found.blend_files:
        raise SceneRefused(_not_in_zip(wanted, found.blend_files), "no_such_main")
    return list(found.blend_files), found.unpacked_bytes


def _recorded(
    owner: User, upload: RenderUpload, blend_files: list[str], unpacked: int, choices: JobChoices
) -> RenderJob:
    """The job, in the upload's folder, waiting to be unpacked; the upload's row goes, its share of the quota the
    job's (with what its zip unpacks to). Its task is sent once this commits."""
    job = RenderJob(
        owner=owner,
        state=State.UNPACKING,
        upload_name=upload.name,
        folder=upload.folder,
        upload_bytes=upload.length,
        blend_files=blend_files,
        main_file="scene.blend" if upload.kind == "blend" else choices.main_file,
        frame_spec=choices.frame_spec,
        frames=list(choices.frames),
        frame_count=len(choices.frames),
        resolution_percent=choices.resolution_percent,
        samples=choices.samples,
        output_format=choices.output_format,
        gpu_kind=choices.request.kind,
        gpu_profile=choices.request.profile,
        gpu_model=choices.request.model,
        market=choices.market,
        chunk_size=choices.chunk_size,
        max_slices=choices.max_slices,
    )
    job.save(force_insert=True)
    upload.delete()
    storage.job_recorded(upload, job, unpacked)
    send_on_commit(UNPACK_JOB, job.pk, noted=lambda: unpack_sent(job.pk))
    return job


def unpack_sent(job_id: int) -> None:
    RenderJob.objects.filter(pk=job_id).update(unpack_sent_at=timezone.now())


def _not_in_zip(wanted: str, blends: tuple[str, ...]) -> str:
    listed = ", ".join(f"'{name}'" for name in blends[:10])
    return f"The zip holds no '{wanted[:200]}'; its .blend files are {listed}."


def check_main(job: RenderJob, main: str, shown_as: str = "", progress: scenefile.Progress | None = None) -> None:
    """Read the main file's header and blocks; the job is ``validated`` once it passes. Reads (and decompresses)
    the whole file: called by the unpacking task, and by a choice among a zip's files (a file of it at most)."""
    path = job.scene_path().joinpath(*PurePosixPath(main).parts)
    found = scenefile.check_blend(path, settings.RENDER_MAX_UNPACKED_BYTES, shown_as or main, progress)
    job.main_file, job.blender_version = main, found.version
    job.move(State.VALIDATED)


def choose_main_file(job_id: int, main: str) -> RenderJob:
    """Its owner names the scene among the zip's .blend files; SceneRefused if it is not one of them, or its first
    bytes say it is no .blend (the job then waits for another choice). The job goes back to its unpacking task,
    which reads the whole file, outside this request and this lock."""
    with transaction.atomic():
        job = RenderJob.objects.select_for_update().get(pk=job_id)
        if job.state != State.UPLOADED:
            raise RenderJob.BadStep("This job's main file is already chosen.")
        if main not in job.blend_files:
            raise SceneRefused(_not_in_zip(main, tuple(job.blend_files)), "no_such_main")
        scenefile.check_blend_header(job.scene_path().joinpath(*PurePosixPath(main).parts), main)
        job.main_file, job.unpack_sent_at, job.unpack_heard_at = main, None, None
        job.save(update_fields=[*job.move(State.UNPACKING), "main_file", "unpack_sent_at", "unpack_heard_at"])
        send_on_commit(UNPACK_JOB, job.pk, noted=lambda: unpack_sent(job.pk))
    return job


def locked(job_id: int) -> RenderJob:
    return RenderJob.objects.select_for_update().get(pk=job_id)


def move(job_id: int, to: RenderJob.State, message: str = "") -> RenderJob:
    """One step of a job, under its row's lock: what the later steps (estimate, queue, render) call."""
    with transaction.atomic():
        job = RenderJob.objects.select_for_update().get(pk=job_id)
        job.save(update_fields=job.move(to, message))
    return job


def cancel_before_queue(job_id: int) -> RenderJob:
    """Cancel a job nothing of which runs yet, and remove its files. BadStep for a finished job, or one
    the render steps own (estimating, queued, rendering), whose cancel stops containers first."""
    with transaction.atomic():
        job = RenderJob.objects.select_for_update().get(pk=job_id)
        if job.state not in RenderJob.BEFORE_QUEUE:
            if job.ended:
                raise RenderJob.BadStep(f"This job is already {job.get_state_display().lower()}.")
            raise RenderJob.BadStep(f"A job that is {job.get_state_display().lower()} cannot be cancelled here yet.")
        job.save(update_fields=job.move(State.CANCELLED))
    remove_files(job)
    return job


def remove_files(job: RenderJob) -> bool:
    """Remove the job's folder (its owner's too once it holds nothing else) and note when; False, noted
    nowhere, if the folder could not be removed (one reached through a link is left alone)."""
    if not files.remove_job_folder(Path(settings.RENDER_DIR), job.folder_path()):
        return False
    job.files_removed_at = timezone.now()
    job.save(update_fields=["files_removed_at"])
    storage.files_gone(job)
    return True


def remove_orphan_folders(untouched_for: timedelta = timedelta(hours=6)) -> int:
    """Remove job folders that no job or upload owns and nothing has written to for ``untouched_for``: what an
    upload left when its process died before its row was written (a refused one removes its own at once).
    Returns how many."""
    root = Path(settings.RENDER_DIR)
    found = {f"{folder.parent.name}/{folder.name}": folder for folder in root.glob("*/*") if folder.is_dir()}
    owned = set(RenderJob.objects.filter(folder__in=list(found)).values_list("folder", flat=True))
    owned |= set(RenderUpload.objects.filter(folder__in=list(found)).values_list("folder", flat=True))
    cutoff = (timezone.now() - untouched_for).timestamp()
    removed = 0
    for relative, folder in found.items():
        if relative not in owned and _last_written(folder) < cutoff:
            remove_folder(folder)
            removed += 1
    return removed


def _last_written(folder: Path) -> float:
    return max((path.lstat().st_mtime for path in [folder, *folder.rglob("*")]), default=0.0)
