"""A render job's slices: how many it is given (``dispatch``: up to ``max_slices`` while chunks wait, within its
owner's share of the render worker's threads), a further one for a chunk to retry on, and giving one back (a
spot reclaim). Each slice gets a worker (``sessions.render.chunks``) that renders the job's waiting chunks on it
one after another, then releases it; the worker is sent to the render queue of the slice's host
(``sessions.render.queues``). Tasks call these; these enqueue the slices' workers by name.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from sessions.gpus import holdings
from sessions.gpus.allocator import AllocationRefused, allocate
from sessions.gpus.holders import Holder, HolderKind
from sessions.gpus.models import Slice
from sessions.render import containers, progress, queues
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.render.services import RUNNING, held_by, locked
from sessions.runtime import engines
from sessions.runtime.docker import RuntimeError_

log = logging.getLogger(__name__)
ChunkState = RenderChunk.State
FrameState = RenderFrame.State


def dispatch(job_id: int) -> int:
    """Give a queued or rendering job up to ``max_slices`` slices while chunks wait, and a worker to each of
    its slices that has none; returns how many workers were sent. No slice free: it waits (reconciliation
    tries again). Under the job's row lock, so two dispatches at once (the confirm's task and reconciliation)
    take turns and never give it more than ``max_slices``."""
    with transaction.atomic():
        job = RenderJob.objects.select_for_update().select_related("owner").get(pk=job_id)
        if job.state not in RUNNING:
            return 0
        waiting = job.chunks.filter(state=ChunkState.PENDING).count()
        held = held_by(job_id)
        rendering = set(job.chunks.filter(state=ChunkState.RENDERING).values_list("slice_id", flat=True))
        idle = [taken for taken in held if taken.pk not in rendering]
        wanted = min(job.max_slices, len(held) - len(idle) + waiting)
        room = share_of_threads(job.owner_id) - rendering_slices(job.owner_id)  # each slice takes a thread
        for _ in range(max(0, min(wanted - len(held), room))):
            try:
                idle.append(allocate(job.owner, job.request, holder=Holder.render(job_id)))
            except AllocationRefused as refused:
                log.info("render job %s waits for a slice: %s", job_id, refused.reason)
                break
    for taken in idle:
        queues.send_worker(job_id, taken.pk)  # to the render queue of the slice's host
    return len(idle)


def share_of_threads(owner_id: int) -> int:
    """A person's fair share of the render worker's threads (PORTAL_RENDER_CONCURRENCY): all of them while nobody
    else renders, else an equal part, at least one each. A slice's worker holds a thread for as long as it has
    chunks, so one person's long job would otherwise hold them all while everyone else's waited."""
    people = set(RenderJob.objects.filter(state__in=RUNNING).values_list("owner_id", flat=True)) | {owner_id}
    return max(1, settings.RENDER_THREADS // len(people))


def rendering_slices(owner_id: int) -> int:
    """The slices a person's queued and rendering jobs hold, each followed by one of the render worker's threads."""
    jobs = RenderJob.objects.filter(owner_id=owner_id, state__in=RUNNING).values("pk")
    held = Slice.objects.filter(owner_id=owner_id, holder_kind=HolderKind.RENDER, released_at__isnull=True)
    return held.filter(holder_id__in=jobs).count()


def jobs_short_of_threads(but: int) -> list[int]:
    """Other people's queued or rendering jobs whose chunks wait while their owner holds less than their share."""
    waiting = RenderJob.objects.filter(state__in=RUNNING, chunks__state=ChunkState.PENDING).exclude(owner_id=but)
    found = waiting.distinct().order_by("queued_at", "pk").values_list("pk", "owner_id")
    return [job_id for job_id, owner_id in found if rendering_slices(owner_id) < share_of_threads(owner_id)]


def another_slice(job: RenderJob) -> Slice | None:
    """A further slice of the job's offer for a chunk that failed on the one it holds; None where none is free
    (the chunk is tried again where it failed). The caller releases the slice it failed on and carries on on
    this one, so the job holds no more slices than before."""
    try:
        return allocate(job.owner, job.request, holder=Holder.render(job.pk))
    except AllocationRefused as refused:
        log.info("render job %s: no other slice for a retry (%s); it is tried where it failed", job.pk, refused.reason)
        return None


def give_up_slice(job_id: int, slice_id: int, reason: str) -> None:
    """One of the job's slices is taken back (a spot reclaim): the chunk rendering there waits again without
    losing an attempt, and once this commits its container stops and the slice is released at the container's
    end (handed to the launch waiting for it); the job goes on on its other slices, or on one taken afresh."""
    with transaction.atomic():
        job = locked(job_id)
        taken = Slice.objects.filter(pk=slice_id, released_at__isnull=True).first()
        if taken is None or taken.holder != Holder.render(job_id):
            return
        for chunk in job.chunks.select_for_update().filter(state=ChunkState.RENDERING, slice_id=slice_id):
            chunk.state, chunk.attempts = ChunkState.PENDING, max(0, chunk.attempts - 1)
            chunk.save(update_fields=["state", "attempts"])
            job.frame_results.filter(number__in=chunk.frames, state=FrameState.RENDERING).update(
                state=FrameState.PENDING
            )
        progress.announce(job)
        transaction.on_commit(lambda: _stop_slice(slice_id, reason), robust=True)


def _stop_slice(slice_id: int, reason: str) -> None:
    """Stop the slice's containers on its host's engine and release it at their end; an engine that does not
    answer ends the holding at its last proof of life, so the slice still goes to whoever waits for it."""
    try:
        runtime = engines.for_slice(Slice.objects.select_related("gpu__host").get(pk=slice_id))
        ended = containers.stop(runtime, runtime.containers_for("slice", str(slice_id)))
    except (RuntimeError_, OSError) as error:
        log.error("slice %s: cannot stop its containers (%s); it ends at its last proof of life", slice_id, error)
        ended = None
    holdings.end(slice_id, ended, reason)
