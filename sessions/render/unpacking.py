"""A job's scene unpacked and checked off the request: a Celery task extracts its zip (or reads its .blend, which
may mean decompressing it whole) and checks the main file, outside any row lock, while the job waits in
``unpacking`` and its page shows how far the task has got.

A task claims the job with a conditional update, so two copies never unpack one job; a running one says so every
few seconds (``unpack_heard_at``). One whose worker died goes silent, and reconciliation sends the task again
(``sessions/render/recovery.py``), which starts the zip over. Only the step at the end takes the row's lock: a job
cancelled meanwhile stays cancelled and loses its files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from sessions.render import files, filestore, jobs, progress, scenefile, services, storage, stores
from sessions.render.models import RenderJob
from sessions.render.scenefile import SceneRefused

State = RenderJob.State
HEARTBEAT_S = 5
SILENCE = timedelta(minutes=2)  # a task not heard of for this long is gone (it says so every HEARTBEAT_S)
KEPT_S = 3600


def progress_key(job_id: int) -> str:
    return f"render:unpacking:{job_id}"


@dataclass
class Unpacking:
    """One run's progress: what it is doing, how far, and when it last told the database it runs."""

    job_id: int
    phase: str = "Unpacking"
    total: int = 0
    heard: float = field(default_factory=time.monotonic)

    def begin(self, phase: str, total: int) -> None:
        self.phase, self.total = phase, total
        self.told(0)

    def told(self, done: int) -> None:
        cache.set(progress_key(self.job_id), {"phase": self.phase, "done": done, "total": self.total}, KEPT_S)
        if time.monotonic() - self.heard >= HEARTBEAT_S:
            self.heard = time.monotonic()
            RenderJob.objects.filter(pk=self.job_id, state=State.UNPACKING).update(unpack_heard_at=timezone.now())


def shown(job: RenderJob) -> dict[str, object]:
    """What the job's page shows while it unpacks: the phase, and how far as a percentage."""
    found = cache.get(progress_key(job.pk)) or {}
    done, total = int(found.get("done", 0)), int(found.get("total", 0))
    return {
        "phase": found.get("phase", "Waiting to be unpacked"),
        "done": done,
        "total": total,
        "percent": min(100, 100 * done // total) if total else 0,
    }


def claim(job_id: int) -> bool:
    """Take the job for this run, unless another run took it and was heard of lately."""
    now = timezone.now()
    silent = Q(unpack_heard_at__isnull=True) | Q(unpack_heard_at__lt=now - SILENCE)
    return RenderJob.objects.filter(silent, pk=job_id, state=State.UNPACKING).update(unpack_heard_at=now) == 1


def unpack(job_id: int) -> RenderJob:
    """Unpack and check the job's scene; it becomes ``validated`` (and goes to its estimate), ``uploaded`` (a zip
    with several .blend files: its owner chooses) or ``failed`` with the reason in words."""
    if not claim(job_id):
        return RenderJob.objects.get(pk=job_id)
    job = RenderJob.objects.get(pk=job_id)
    run = Unpacking(job_id)
    try:
        _unpacked(job, run)
    except SceneRefused as refused:
        return _ended(job_id, refused.message)
    except filestore.SceneChanged as odd:  # a link or a device file among the scene's files
        return _ended(job_id, f"The scene was refused: {odd}.")
    except OSError as error:
        return _ended(job_id, f"The scene could not be unpacked on the portal's disk ({error.strerror or error}).")
    finally:
        cache.delete(progress_key(job_id))
    finished = _finished(job)
    storage.measure_job(finished)  # the zip gone, the scene unpacked: its share as it lies on disk now
    return finished


def _unpacked(job: RenderJob, run: Unpacking) -> None:
    """The work itself, on the job in memory: the zip extracted (again from its start if a run was cut off), then
    the main file's blocks read."""
    archive = job.folder_path() / "upload.zip"
    if archive.exists():
        limits = jobs.zip_limits()
        run.begin("Unpacking", scenefile.check_zip(archive, limits).unpacked_bytes)
        if job.scene_path().exists():
            files.remove_entry(job.scene_path())
        scene = scenefile.extract_zip(archive, job.scene_path(), limits, run.told)
        archive.unlink()
        job.scene_bytes, job.blend_files = scene.unpacked_bytes, list(scene.blend_files)
    elif not job.blend_files:
        job.scene_bytes = job.upload_bytes
    run.begin("Recording the scene's checksum", job.scene_bytes)
    job.scene_sha256 = stores.current().record_scene(job, run.told)  # what every render worker checks
    main = job.main_file or (job.blend_files[0] if len(job.blend_files) == 1 else "")
    if not main:
        job.move(State.UPLOADED)
        return
    path = job.scene_path().joinpath(*main.split("/"))
    run.begin("Checking the scene", path.stat().st_size)
    jobs.check_main(job, main, job.scene_name, run.told)


def _finished(unpacked: RenderJob) -> RenderJob:
    with transaction.atomic():
        job = jobs.locked(unpacked.pk)
        if job.state != State.UNPACKING:  # cancelled meanwhile: its files go (again, if the cancel removed them)
            transaction.on_commit(lambda: jobs.remove_files(job), robust=True)
            return job
        fields = ["scene_bytes", "scene_sha256", "blend_files", "main_file", "blender_version"]
        for name in fields:
            setattr(job, name, getattr(unpacked, name))
        job.save(update_fields=[*job.move(State(unpacked.state)), *fields])
        if job.state == State.VALIDATED:  # on to its estimate in the same step: nobody sees it stop between
            return services.request_estimate(job.pk)
        progress.announce(job)
    return job


def _ended(job_id: int, message: str) -> RenderJob:
    """The scene was refused: the job fails with the reason and its files go (nothing of it can render)."""
    with transaction.atomic():
        job = jobs.locked(job_id)
        if job.state == State.UNPACKING:
            job.save(update_fields=job.move(State.FAILED, message))
            progress.announce(job)
    jobs.remove_files(job)
    return job
