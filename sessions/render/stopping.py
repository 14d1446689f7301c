"""Stopping a render job: its owner's cancel, and a stop for a reason that is not theirs (credit ran out, its
spot slices were reclaimed, an operator); either way its containers stop and its slices are released, each
holding charged to its container's end."""

from __future__ import annotations

import contextlib

from django.db import transaction
from django.utils import timezone

from sessions.render import jobs, progress
from sessions.render.models import RenderChunk, RenderJob
from sessions.render.services import RUNNING, held_by, locked, stop_and_release, stop_job

State = RenderJob.State
ChunkState = RenderChunk.State


def cancel(job_id: int) -> RenderJob:
    """Cancel a job. Before it is queued its files go: at once when nothing of it runs
    (``jobs.cancel_before_queue``), else once its probe's container is stopped and its slice released, the
    probe's minutes charged to the container's end. After, its containers stop and its slices are released
    at once, so charges end there; its finished frames stay."""
    if RenderJob.objects.get(pk=job_id).state in RenderJob.BEFORE_QUEUE and not held_by(job_id):
        with contextlib.suppress(RenderJob.BadStep):  # it moved on meanwhile (to its probe): cancelled below
            return jobs.cancel_before_queue(job_id)
    with transaction.atomic():
        job = locked(job_id)
        if job.ended:
            raise RenderJob.BadStep(f"This job is already {job.get_state_display().lower()}.")
        queued = job.state in RUNNING
        job.save(update_fields=job.move(State.CANCELLED))
        if queued:
            job.chunks.filter(state=ChunkState.RENDERING).update(state=ChunkState.CANCELLED, finished_at=timezone.now())
            stop_job(job)
        else:
            transaction.on_commit(lambda: _stop_probe(job_id), robust=True)
        progress.announce(job)
    return job


STOPPED_FOR = {
    "credit": "Stopped: your credit ran out. Once it is topped up, queue the frames that are not done again.",
    "preempted": "Stopped: its spot slices were reclaimed for an on-demand launch. Queue the frames that are not done"
    " again to go on.",
    "staff": "Stopped by an operator. Queue the frames that are not done again to go on.",
}


def stop_for(job_id: int, reason: str) -> RenderJob:
    """Stop a job for a reason that is not its owner's (credit ran out, its spot slices were reclaimed): it fails
    saying why, so its frames that are not done can be queued again, and its containers stop and its slices are
    released once this commits (each holding charged to its container's end). One estimating fails the same
    way (nothing of it rendered yet: its scene is uploaded again). One that holds nothing yet is left as it is."""
    message = STOPPED_FOR.get(reason, f"Stopped: {reason}.")
    with transaction.atomic():
        job = locked(job_id)
        if job.state not in (State.ESTIMATING, *RUNNING):
            return job
        estimating = job.state == State.ESTIMATING
        job.save(update_fields=job.move(State.FAILED, message))
        if estimating:
            transaction.on_commit(lambda: _stop_probe(job_id), robust=True)
        else:
            job.chunks.filter(state=ChunkState.RENDERING).update(state=ChunkState.CANCELLED, finished_at=timezone.now())
            stop_job(job)
        progress.announce(job)
    return job


def _stop_probe(job_id: int) -> None:
    """A job cancelled while its probe may run: the probe's container stops, its slice is released (charged to
    the container's end), then the job's files go."""
    stop_and_release(job_id, "render job cancelled before it was queued")
    jobs.remove_files(RenderJob.objects.get(pk=job_id))
