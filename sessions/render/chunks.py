"""A slice's worker: the job's waiting chunks rendered one after another on one of its slices.

Each chunk runs in the render sandbox (``sessions.runtime.render``): frames are recorded, with their
thumbnails, as Blender says it saved them; progress is pushed as its lines come. A chunk that fails is
tried again, only for its frames not saved yet, on another slice where one is free: another of the job's
slices, else a free slice of its offer taken in place of the one it failed on (released at once), else where
it failed; its last attempt failing fails the job. A run that writes more than PORTAL_RENDER_MAX_OUTPUT_BYTES
into its output folder (its own, below the job's ``frames``), or more than is left of its owner's storage
quota, is stopped and fails the job at once: the scene would only do it again. When no chunk is left for the
slice, the slice is released at once, its holding ending with its last container.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from sessions.gpus import holdings, orders
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.render import (
    containers,
    files,
    filestore,
    kubejobs,
    progress,
    queues,
    slices,
    storage,
    stores,
    thumbnails,
)
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.render.services import (
    RUNNING,
    estimate_of,
    held_by,
    locked,
    render_settings,
    stop_job,
)
from sessions.render.thumbnails import make_thumbnail
from sessions.runtime import blender
from sessions.runtime.blender_log import Event
from sessions.runtime.docker import RuntimeError_
from sessions.runtime.render import RENDER_IMAGE, render
from sessions.runtime.slices import spec_for
from sessions.runtime.watchdogs import size_words

if TYPE_CHECKING:  # the cluster's client is loaded only where a kube:// host renders
    from sessions.runtime.kube.runs import JobRuntime

log = logging.getLogger(__name__)
State = RenderJob.State
ChunkState = RenderChunk.State
FrameState = RenderFrame.State


@dataclass(frozen=True)
class Claim:
    job: RenderJob
    chunk: RenderChunk
    taken: Slice


@dataclass(frozen=True)
class Outcome:
    """How one run of a chunk went: why it failed (None: it did not), Blender's last words, the live figures,
    and whether trying again is pointless (it wrote past the output limit)."""

    failure: str | None
    excerpt: str
    live: dict[str, object]
    final: bool = False


BUSY = "busy"  # another worker renders on this slice now: leave it to that one
YIELD = "yield"  # its owner holds more than their share of the render threads while someone else's job waits


@dataclass(frozen=True)
class Moved:
    """The chunk that failed on this slice goes on to another free slice, taken for the job: this worker
    releases the slice it leaves and carries on there when it is on the same host (no task to send: a broker
    that does not answer cannot strand the new slice), else sends the new slice's worker to its host's queue."""

    slice_id: int


def work_on_slice(job_id: int, slice_id: int) -> int:
    """Render the job's waiting chunks on this slice, one after another, then release it; returns how many
    chunks ran here (and on the slices a retry moved it to). A slice whose MIG instance its host's agent did
    not make is let go before any chunk is claimed; reconciliation dispatches the job again."""
    ran = 0
    last_end: datetime | None = None
    if not _made(job_id, slice_id):
        return ran
    while True:
        claim = _claim(job_id, slice_id)
        if claim == BUSY:
            return ran
        if claim == YIELD:
            _let_go(job_id, slice_id, last_end, "its thread went to another person's render job")
            for waiting in slices.jobs_short_of_threads(but=RenderJob.objects.get(pk=job_id).owner_id):
                slices.dispatch(waiting)
            return ran
        if isinstance(claim, Moved):
            _let_go(job_id, slice_id, last_end, "render chunk retried on another slice")
            if queues.host_of(claim.slice_id) != queues.host_of(slice_id):
                _hand_over(job_id, claim.slice_id)  # another host's: its own render worker renders there
                return ran
            slice_id, last_end = claim.slice_id, None
            if not _made(job_id, slice_id):
                return ran
            continue
        if claim is None:
            break
        assert isinstance(claim, Claim)
        last_end = _run(claim) or last_end
        ran += 1
    _let_go(job_id, slice_id, last_end, "render job needs it no more")
    return ran


def _hand_over(job_id: int, slice_id: int) -> None:
    """The slice a retry moved to is on another host: its worker goes to that host's render queue. A broker
    that does not answer strands nothing: reconciliation sends a worker to a slice nobody works on."""
    try:
        queues.send_worker(job_id, slice_id)
    except Exception as error:
        log.error("render job %s: slice %s's worker not sent (%s); reconciliation sends it", job_id, slice_id, error)


def _made(job_id: int, slice_id: int) -> bool:
    """Whether the slice's MIG instance is made (its host's agent makes it; ``sessions.gpus.orders``); one that
    was not is let go, its chunk waiting for another slice."""
    try:
        orders.wait_for_slice(slice_id)
    except orders.OrderFailed as failed:
        log.warning("render job %s: slice %s was not made: %s", job_id, slice_id, failed.reason)
        _let_go(job_id, slice_id, None, "its GPU instance was not made")
        return False
    return True


def _let_go(job_id: int, slice_id: int, last_end: datetime | None, reason: str) -> None:
    """Release the slice, its holding ending with its last container."""
    taken = Slice.objects.get(pk=slice_id)
    if taken.released_at is None:
        holdings.end(slice_id, last_end, reason)
        progress.announce(RenderJob.objects.get(pk=job_id))


def _claim(job_id: int, slice_id: int) -> Claim | Moved | str | None:
    """The next chunk for this slice, marked as rendering on it; None when the job has none for it; Moved
    when the next one failed here and another slice was free for it."""
    with transaction.atomic():
        job = locked(job_id)
        taken = Slice.objects.filter(pk=slice_id, released_at__isnull=True).select_related("gpu").first()
        if taken is None or taken.holder != Holder.render(job_id) or job.state not in RUNNING:
            return None
        chunks = job.chunks.select_for_update()
        if chunks.filter(state=ChunkState.RENDERING, slice_id=slice_id).exists():
            return BUSY
        waiting = chunks.filter(state=ChunkState.PENDING).order_by("index")
        if any(other.pk != slice_id for other in held_by(job_id)):
            waiting = waiting.exclude(slice_id=slice_id)  # a chunk that failed here is retried on another slice
        chunk = waiting.first()
        if chunk is None:
            return None
        if _more_than_its_share(job.owner_id):
            return YIELD
        if _failed_here(chunk, slice_id) and (other := slices.another_slice(job)) is not None:
            return Moved(other.pk)
        chunk.state, chunk.slice, chunk.attempts = ChunkState.RENDERING, taken, chunk.attempts + 1
        chunk.started_at, chunk.finished_at = timezone.now(), None
        chunk.save(update_fields=["state", "slice", "attempts", "started_at", "finished_at"])
        job.frame_results.filter(number__in=chunk.frames).exclude(state=FrameState.DONE).update(
            state=FrameState.RENDERING
        )
        if job.state == State.QUEUED:
            job.save(update_fields=job.move(State.RENDERING))
        progress.announce(job)
        return Claim(job, chunk, taken)


def _more_than_its_share(owner_id: int) -> bool:
    """Its owner holds more render threads than their share and someone else's job waits for one: this slice's
    worker lets it go between chunks (the job goes on on its other slices)."""
    held = slices.rendering_slices(owner_id)
    return held > slices.share_of_threads(owner_id) and bool(slices.jobs_short_of_threads(but=owner_id))


def _failed_here(chunk: RenderChunk, slice_id: int) -> bool:
    """The chunk waits for a retry after an attempt that failed on this slice (one put back after its worker
    died has not finished: it renders here again)."""
    return chunk.slice_id == slice_id and chunk.finished_at is not None


def output_folder(job: RenderJob, chunk: RenderChunk) -> Path:
    """One run's own output folder (mounted at /out), as the file store gives it: the watchdog counts only what
    this run wrote."""
    return stores.current().output_for(job, kubejobs.run_name(chunk))


def _run(claim: Claim) -> datetime | None:
    """Render one chunk in the sandbox, its output bound by what is left of its owner's storage quota (a person
    whose quota is used up renders nothing: no container starts); returns its container's end moment. The job's
    share of the quota is measured again after."""
    job, chunk, taken = claim.job, claim.chunk, claim.taken
    output = output_folder(job, chunk)
    files.make_private(output)
    bound = storage.output_bound(job.owner_id)
    watched = kubejobs.watched_for(
        taken, job, kubejobs.run_name(chunk), output_bytes=bound.limit, wall_time_s=settings.RENDER_CHUNK_WALL_SECONDS,
        may_start=functools.partial(_may_render, job.pk, chunk.pk, taken.pk),
    )  # fmt: skip
    watched.on_started = lambda at: _started(job.pk, chunk.pk, taken.pk, watched, at)
    if bound.limit > 0:
        outcome = _rendered(claim, output, watched, bound)
    else:
        outcome = Outcome(bound.exceeded(), "", {}, final=True)
    if watched.finished_at is not None:
        holdings.seen([taken.pk], at=watched.finished_at)  # it ran until then, whatever it printed last
    if _chunk_ended(job.pk, chunk.pk, taken.pk, outcome) in (ChunkState.PENDING, ChunkState.FAILED):
        _keep_only_frames(job, output)  # the attempt failed: what it wrote besides its frames is of no use
    stores.current().run_ended(job, output)
    stores.current().measure(job)
    return watched.finished_at


def _rendered(
    claim: Claim, output: Path, watched: containers.Watched | JobRuntime, bound: storage.OutputBound
) -> Outcome:
    """The chunk's run in the sandbox, its frames recorded as Blender saves them: how it went."""
    job, chunk, taken = claim.job, claim.chunk, claim.taken
    how = render_settings(job, taken)
    try:  # checked against what unpacking recorded; on a GPU host of its own, fetched with the job's estimate
        scene = stores.current().fetch_scene(job)
    except filestore.SceneChanged as changed:  # it would be so on every slice: the job fails at once
        return Outcome(str(changed), "", {}, final=True)
    except (FileNotFoundError, ValueError, filestore.StoreUnreachable) as error:
        return Outcome(str(error), "", {})
    written = Written(job, chunk, output, _most_pixels(job), how.preview_pixels**2)
    run = progress.ChunkRun(
        job, on_saved=lambda name: _frame_saved(written, name), on_preview=lambda n: _thumbnail_from_preview(written, n)
    )
    alive = holdings.Heartbeat(taken.pk)  # each line Blender prints shows its container runs: the meter's proof
    try:
        result = render(
            watched,
            spec_for(taken, RENDER_IMAGE, labels=containers.labels(job.pk, chunk.pk)),
            scene,
            output,
            tuple(chunk.frames),
            how,
            wall_time_s=settings.RENDER_CHUNK_WALL_SECONDS,
            on_line=_and(alive, run.line),
            output_limit=bound.limit,
        )
        for frame, path in result.saved.items():
            _frame_saved(written, path.name, frame)
            if result.said_preview(frame):
                _thumbnail_from_preview(written, frame)
        _remove_previews(output)
        outcome = Outcome(result.failure, result.log.excerpt(), run.live())
        if result.exit.output_exceeded:
            why = bound.exceeded() if bound.by_quota else _too_much_output(bound.limit)
            outcome = Outcome(why, outcome.excerpt, outcome.live, final=True)
    except (RuntimeError_, FileNotFoundError, ValueError, filestore.StoreUnreachable) as error:
        outcome = Outcome(str(error), "", run.live())  # a frame not given back: the attempt is tried again
    return outcome


def _and(first: Callable[..., None], then: Callable[[str, Event | None], None]) -> Callable[[str, Event | None], None]:
    """Both callbacks for each line."""

    def both(text: str, event: Event | None) -> None:
        first()
        then(text, event)

    return both


def _may_render(job_id: int, chunk_id: int, slice_id: int) -> bool:
    """Whether the chunk may still render on the slice: its job is queued or rendering, the chunk is rendering
    there and the slice is held. The job's row is locked to read it, so a cancel that holds it is waited for
    and seen."""
    with transaction.atomic():
        job = locked(job_id)
        return (
            job.state in RUNNING
            and job.chunks.filter(pk=chunk_id, state=ChunkState.RENDERING, slice_id=slice_id).exists()
            and Slice.objects.filter(pk=slice_id, released_at__isnull=True).exists()
        )


def _started(
    job_id: int, chunk_id: int, slice_id: int, watched: containers.Watched | JobRuntime, at: datetime | None
) -> None:
    """The chunk's container started: its slice is held from then, recorded in the same step as the chunk is
    found still its own. If its job was cancelled (or the chunk put back) meanwhile, the container is killed
    at once and holds nothing: the cancel may have looked for the job's containers before this one existed,
    and its charges ended with it. Either way a cancel is final."""
    with transaction.atomic():
        if _may_render(job_id, chunk_id, slice_id):
            holdings.started(slice_id, at or timezone.now())
            return
    if watched.container_id is not None:
        log.info("render job %s: chunk %s's container started after its end; killed", job_id, chunk_id)
        watched.kill(watched.container_id)


def _too_much_output(limit: int) -> str:
    return (
        f"the render wrote more than {size_words(limit)} into its output folder, the most one chunk may write "
        "(PORTAL_RENDER_MAX_OUTPUT_BYTES); it was stopped and is not tried again"
    )


def _keep_only_frames(job: RenderJob, output: Path) -> None:
    """What a failed run leaves: its finished frames stay (their rows point into its folder), the rest goes at
    once, and the folder too where it finished none."""
    done = job.frame_results.filter(state=FrameState.DONE).exclude(output_path="")
    files.prune(output, {job.folder_path() / path for path in done.values_list("output_path", flat=True)})
    with contextlib.suppress(OSError):  # not empty: it holds finished frames
        output.rmdir()


@dataclass(frozen=True)
class Written:
    """One run's output folder, as the portal reads it: the sandbox wrote everything in it, so a frame is
    decoded for its thumbnail only up to the pixels the job renders (``most_pixels``; 0 where the job has no
    estimate to say: then none is), and Blender's small PNG of a frame up to its own size."""

    job: RenderJob
    chunk: RenderChunk
    folder: Path
    most_pixels: int
    preview_pixels: int


def _most_pixels(job: RenderJob) -> int:
    """The most pixels a frame of the job may have: the scene's resolution, as its probe read it, at the
    job's percentage (``thumbnails.most_pixels``); 0 if no estimate says."""
    facts = found.facts if (found := estimate_of(job)) is not None else {}
    width, height = facts.get("resolution_x"), facts.get("resolution_y")
    if not isinstance(width, int) or not isinstance(height, int):
        return 0
    return thumbnails.most_pixels(width, height, job.resolution_percent)


def _frame_saved(written: Written, name: str, number: int | None = None) -> None:
    """Blender said it saved a frame of this chunk as ``name``: if that is a file of its own in the run's
    folder (opened once, never through a link), the frame is done, with its thumbnail (once)."""
    job, chunk = written.job, written.chunk
    if number is None:
        number = next((n for n in chunk.frames if blender.frame_file(n, job.output_format) == name), None)
    frame = None if number is None else job.frame_results.filter(number=number).exclude(state=FrameState.DONE).first()
    if frame is None:
        return
    opened = files.open_written(written.folder, name)
    if opened is None:  # a link, a FIFO, a folder: the container made it, and nothing of it is read
        return
    store = stores.current()
    with opened:
        thumbnail = None
        if job.output_format == RenderJob.OutputFormat.PNG:  # another format's comes from Blender's own PNG
            folder = store.thumbnails_for(job)
            thumbnail = make_thumbnail(opened, folder, settings.RENDER_THUMBNAIL_PIXELS, name, written.most_pixels)
        stored = store.put_frame(job, written.folder, name, opened)  # given back, with its checksum
    frame.state, frame.finished_at = FrameState.DONE, timezone.now()
    frame.output_path, frame.sha256 = stored.path, stored.sha256
    frame.thumbnail_path = store.put_thumbnail(job, thumbnail) if thumbnail else ""
    frame.save(update_fields=["state", "finished_at", "output_path", "sha256", "thumbnail_path"])


def _thumbnail_from_preview(written: Written, number: int) -> None:
    """A saved frame Pillow is not given (OpenEXR) gets its thumbnail from the small PNG Blender wrote of it,
    which then goes."""
    job = written.job
    frame = job.frame_results.filter(number=number, state=FrameState.DONE, thumbnail_path="").first()
    name = blender.preview_file(number)
    if frame is None:
        return
    opened = files.open_written(written.folder, name)
    if opened is not None:
        store = stores.current()
        with opened:
            pixels = settings.RENDER_THUMBNAIL_PIXELS
            made = make_thumbnail(opened, store.thumbnails_for(job), pixels, frame.output_path, written.preview_pixels)
        if made is not None:
            frame.thumbnail_path = store.put_thumbnail(job, made)
            frame.save(update_fields=["thumbnail_path"])
    (written.folder / name).unlink(missing_ok=True)  # a link is removed as a link


def _remove_previews(output: Path) -> None:
    """Blender's PNGs of the frames served their thumbnails; the results are the frames alone."""
    for preview in output.glob(blender.PREVIEW_NAME.replace("{:06d}", "*")):
        if preview.is_symlink() or preview.is_file():
            preview.unlink(missing_ok=True)  # a link is removed as a link


def _chunk_ended(job_id: int, chunk_id: int, slice_id: int, outcome: Outcome) -> str | None:
    """Record how the run went; the chunk's state after it (None: it was no longer this run's to record)."""
    with transaction.atomic():
        job = locked(job_id)
        chunk = RenderChunk.objects.select_for_update().get(pk=chunk_id)
        if chunk.state != ChunkState.RENDERING or chunk.slice_id != slice_id:
            return None  # cancelled, or put back by reconciliation meanwhile
        missing = list(
            job.frame_results.filter(number__in=chunk.frames)
            .exclude(state=FrameState.DONE)
            .values_list("number", flat=True)
        )
        chunk.finished_at, chunk.log_excerpt = timezone.now(), outcome.excerpt[-8000:]
        if job.ended:
            chunk.state = ChunkState.CANCELLED
        elif not missing:  # every frame is saved: done, whatever Blender's exit status said
            chunk.state = ChunkState.DONE
        elif chunk.attempts < settings.RENDER_CHUNK_ATTEMPTS and not outcome.final:
            chunk.state, chunk.frames = ChunkState.PENDING, sorted(missing)
            job.frame_results.filter(number__in=missing).update(state=FrameState.PENDING)
            attempt, why = chunk.attempts, outcome.failure
            log.info("render job %s chunk %s: attempt %s failed: %s", job_id, chunk.index, attempt, why)
        else:
            chunk.state = ChunkState.FAILED
            _fail(job, chunk, missing, outcome)
        chunk.save(update_fields=["state", "frames", "finished_at", "log_excerpt"])
        if job.state == State.RENDERING and not job.frame_results.exclude(state=FrameState.DONE).exists():
            job.save(update_fields=job.move(State.DONE))
        progress.announce(job, outcome.live)
    return str(chunk.state)


def _fail(job: RenderJob, chunk: RenderChunk, missing: list[int], outcome: Outcome) -> None:
    """The chunk failed its last attempt (or one not worth repeating): the job fails with why, its other
    chunks stop."""
    frames = ", ".join(str(n) for n in missing[:20]) + (" …" if len(missing) > 20 else "")
    failure = outcome.failure or f"{len(missing)} frames were not saved"
    if outcome.final:
        message = f"Frames {frames} failed: {failure}."
    else:
        message = f"Frames {frames} failed {chunk.attempts} times; the last time: {failure}."
    if chunk.log_excerpt:
        message += f"\n\n{chunk.log_excerpt}"
    job.save(update_fields=job.move(State.FAILED, message))
    job.frame_results.filter(number__in=missing).update(state=FrameState.FAILED)
    stop_job(job)
