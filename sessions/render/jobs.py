"""The render job services up to the estimate: a checked upload becomes a job, its owner picks the main
file of a zip that holds several, and a job that has not been queued yet is cancelled.

Only these functions (and the later steps' services) change a job; each takes the row's lock, moves
it through ``RenderJob.move`` and saves the fields that step wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from sessions.gpus.allocator import SliceRequest
from sessions.render import files, scenefile
from sessions.render.models import RenderJob
from sessions.render.scenefile import SceneRefused, ZipLimits
from sessions.render.uploads import Upload, remove_folder

State = RenderJob.State


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
    return ZipLimits(settings.RENDER_MAX_ZIP_ENTRIES, settings.RENDER_MAX_UNPACKED_BYTES)


def create_job(owner: User, upload: Upload, choices: JobChoices) -> RenderJob:
    """Check the stored upload and record its job: ``validated`` with its main file known, or ``uploaded``
    while its owner has to say which of the zip's .blend files is the scene. SceneRefused leaves the
    upload for the caller to discard."""
    assert upload.path is not None and upload.kind, "the upload handler stored nothing"
    job = RenderJob(
        owner=owner,
        upload_name=upload.name,
        folder=upload.relative,
        upload_bytes=upload.size,
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
    if upload.kind == "zip":
        _unpack(job, upload, choices.main_file)
    else:
        _check_main(job, "scene.blend", upload.name)
        job.scene_bytes = upload.size
    job.save(force_insert=True)
    upload.keep()
    return job


def _unpack(job: RenderJob, upload: Upload, wanted: str) -> None:
    assert upload.path is not None
    if wanted:  # named up front: refuse a wrong name before unpacking anything
        blends = scenefile.check_zip(upload.path, zip_limits()).blend_files
        if wanted not in blends:
            raise SceneRefused(_not_in_zip(wanted, blends), "no_such_main")
    scene = scenefile.extract_zip(upload.path, job.scene_path(), zip_limits())
    upload.path.unlink()
    job.scene_bytes, job.blend_files = scene.unpacked_bytes, list(scene.blend_files)
    main = wanted or (scene.blend_files[0] if len(scene.blend_files) == 1 else "")
    if main:
        _check_main(job, main)


def _not_in_zip(wanted: str, blends: tuple[str, ...]) -> str:
    listed = ", ".join(f"'{name}'" for name in blends[:10])
    return f"The zip holds no '{wanted[:200]}'; its .blend files are {listed}."


def _check_main(job: RenderJob, main: str, shown_as: str = "") -> None:
    """Read the main file's header and blocks; the job is ``validated`` once it passes."""
    path = job.scene_path().joinpath(*PurePosixPath(main).parts)
    found = scenefile.check_blend(path, settings.RENDER_MAX_UNPACKED_BYTES, shown_as or main)
    job.main_file, job.blender_version = main, found.version
    job.move(State.VALIDATED)


def choose_main_file(job_id: int, main: str) -> RenderJob:
    """Its owner names the scene among the zip's .blend files; SceneRefused if it is not one of them, or
    not a readable .blend (the job then waits for another choice)."""
    with transaction.atomic():
        job = RenderJob.objects.select_for_update().get(pk=job_id)
        if job.state != State.UPLOADED:
            raise RenderJob.BadStep("This job's main file is already chosen.")
        if main not in job.blend_files:
            raise SceneRefused(_not_in_zip(main, tuple(job.blend_files)), "no_such_main")
        _check_main(job, main)
        job.save(update_fields=["state", "main_file", "blender_version"])
    return job


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
    return True


def remove_orphan_folders(untouched_for: timedelta = timedelta(hours=6)) -> int:
    """Remove job folders that no job owns and nothing has written to for ``untouched_for``: what an upload
    left when its process died mid-stream (a refused one removes its own at once). Returns how many."""
    root = Path(settings.RENDER_DIR)
    found = {f"{folder.parent.name}/{folder.name}": folder for folder in root.glob("*/*") if folder.is_dir()}
    owned = set(RenderJob.objects.filter(folder__in=list(found)).values_list("folder", flat=True))
    cutoff = (timezone.now() - untouched_for).timestamp()
    removed = 0
    for relative, folder in found.items():
        if relative not in owned and _last_written(folder) < cutoff:
            remove_folder(folder)
            removed += 1
    return removed


def _last_written(folder: Path) -> float:
    return max((path.lstat().st_mtime for path in [folder, *folder.rglob("*")]), default=0.0)
