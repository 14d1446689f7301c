"""Render jobs from the estimate on: the probe, confirmation, cancel, a stop for a reason and re-queue. Only
these functions, the job's slices (``sessions.render.slices``), the slices' workers (``sessions.render.chunks``)
and ``sessions.render.jobs`` (before the estimate) change a job.

A probe renders a few of the job's frames as the job will, on a slice of its offer, in the sandbox; its minutes
are the only ones a job costs before its owner confirms, committing to what the estimate says the job comes to.
A confirmed job is cut into chunks; it holds up to ``max_slices`` slices (``sessions.render.slices``), and each
slice's worker takes the next chunk that is waiting until none is left for it, then releases the slice at once.
A slice's holding runs from its first container's start to its last one's end, as Docker recorded them: what
the billing meter charges. Tasks call these; these enqueue tasks by name.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from portal.celery import send, send_on_commit
from portal.roles import can_launch, launch_refusal
from sessions.gpus import catalog, holdings, orders, pricing, workloads
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.render import containers, estimates, files, filestore, jobs, kubejobs, progress, stores
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.runtime import blender, engines
from sessions.runtime.blender import RenderSettings
from sessions.runtime.docker import RuntimeError_
from sessions.runtime.render import RENDER_IMAGE, Probe, SceneTooLarge, SceneUnreadable, probe
from sessions.runtime.slices import spec_for

if TYPE_CHECKING:  # the cluster's client is loaded only where a kube:// host renders
    from sessions.runtime.kube.runs import JobRuntime

log = logging.getLogger(__name__)
State = RenderJob.State
ChunkState = RenderChunk.State
FrameState = RenderFrame.State
ESTIMATE_JOB = "sessions.render.tasks.estimate_job"
DISPATCH_JOB = "sessions.render.tasks.dispatch_job"
RUNNING = RenderJob.RUNNING
ESTIMATE_FILE = filestore.ESTIMATE_FILE
FORMATS_KEY = "render:formats"  # what the last probe's Blender said it writes; the upload form offers those
FORMATS_KEPT_S = 7 * 24 * 3600
PREVIEW_MOST_PIXELS = 4096


class Refused(Exception):
    """The step was not taken; the message says why, for its owner."""


class ProbeWaits(Exception):
    """No slice is free for the probe now; the task tries again later."""


@dataclass(frozen=True)
class Estimate:
    """What the probe found: the scene's facts as Blender read them, and what the job would take and cost
    (``sessions.render.estimates``): each chunk the per-run overhead plus its frames at the time per frame."""

    facts: dict[str, object]
    device: str
    probe_samples: int | None  # the samples the probe rendered at (the job's; None: the scene's own)
    seconds_per_frame: float
    overhead_s: float  # once per chunk: the container's and Blender's start, the file, the kernels
    frames: int
    chunks: int
    slices: int
    total_seconds: float
    cost: str
    why_cpu: str = ""  # why Cycles renders on the CPU (the GPU is simulated, the build lacks a backend ...)
    probe_frames: tuple[int, ...] = ()  # the frames the probe rendered
    projected_frames: tuple[int, ...] = ()  # those whose sampling the probe stopped: their time is projected
    slowdown: float = 1.0  # the job's slices share the host's cores (Cycles on the CPU): each samples this much slower
    minutes: int = 0  # the minutes billed: each started minute of each slice's holding

    @property
    def on_gpu(self) -> bool:
        return self.device != "CPU"


def locked(job_id: int) -> RenderJob:
    return RenderJob.objects.select_for_update().get(pk=job_id)


def render_settings(job: RenderJob, taken: Slice) -> RenderSettings:
    """How the job renders on this slice; a format Pillow cannot read (OpenEXR) also gets Blender's own small
    PNG of each frame, for its thumbnail."""
    readable = job.output_format == RenderJob.OutputFormat.PNG
    return RenderSettings(
        samples=job.samples,
        percentage=job.resolution_percent,
        file_format=job.output_format,
        gpu=blender.cycles_gpu(taken.gpu.simulated),
        preview_pixels=0 if readable else min(settings.RENDER_THUMBNAIL_PIXELS, PREVIEW_MOST_PIXELS),
        max_side=settings.RENDER_MAX_RESOLUTION,
    )


def writable_formats() -> tuple[str, ...] | None:
    """The output formats the render image's Blender writes, as its last probe said; None until one did."""
    found = cache.get(FORMATS_KEY)
    return tuple(found) if isinstance(found, list | tuple) else None


# The estimate -------------------------------------------------------------------------------------------


def request_estimate(job_id: int) -> RenderJob:
    """A checked job (or one awaiting confirmation, asked again) goes to the probe, whose task is sent once
    this commits; a job already estimating is left as it is (reconciliation took the step meanwhile)."""
    with transaction.atomic():
        job = locked(job_id)
        if job.state == State.ESTIMATING:
            return job
        job.estimate_sent_at = None
        job.save(update_fields=[*job.move(State.ESTIMATING), "estimate_sent_at"])
        send_on_commit(ESTIMATE_JOB, job_id, noted=lambda: _probe_heard_of(job_id))
        progress.announce(job)
    return job


def send_estimate(job_id: int) -> None:
    """Hand the probe's task to the broker, and note when. A send never noted was lost (the broker did not
    answer): reconciliation sends it again."""
    send(ESTIMATE_JOB, job_id, noted=lambda: _probe_heard_of(job_id))


def resume_estimate(job_id: int) -> None:
    """Reconciliation's part: a job left checked goes to its probe (its task sent once that commits); one
    left estimating has its task sent again."""
    if RenderJob.objects.filter(pk=job_id, state=State.VALIDATED).exists():
        request_estimate(job_id)
    else:
        send_estimate(job_id)


def _probe_heard_of(job_id: int) -> None:
    RenderJob.objects.filter(pk=job_id).update(estimate_sent_at=timezone.now())


def probe_request(job: RenderJob) -> SliceRequest:
    """A small slice of the same kind: a MIG job's model's smallest profile, else what the job asks for."""
    request = job.request
    if request.kind != Slice.Kind.MIG or not request.model:
        return request
    profiles = [p for p in catalog.model(catalog.resolve(request.model)).profiles if not p.media_extensions]
    smallest = min(profiles, key=lambda p: (p.compute_slices, p.memory_gib), default=None)
    return SliceRequest(request.kind, smallest.name if smallest else request.profile, request.model, market=job.market)


def _probe_slice(job: RenderJob) -> Slice | None:
    """A slice for the probe; None if the job was cancelled meanwhile or holds one already (another probe of
    it runs: a task sent twice probes once)."""
    with transaction.atomic():
        if locked(job.pk).state != State.ESTIMATING or held_by(job.pk):
            return None
        return _allocate_for_probe(job)


def _allocate_for_probe(job: RenderJob) -> Slice:
    """A slice of the job's own offer, so the probe measures what the job's slices will render at; where
    none is free, a smaller one of its kind (a slower slice: the estimate errs high)."""
    holder = Holder.render(job.pk)
    try:
        return allocate(job.owner, job.request, holder=holder)
    except AllocationRefused:
        try:
            return allocate(job.owner, probe_request(job), holder=holder)
        except AllocationRefused as refused:
            raise ProbeWaits(refused.reason) from None


def estimate(job_id: int) -> RenderJob:
    """Probe the job's first frame in the sandbox and record the estimate; a scene Blender cannot read fails
    the job with Blender's own words. ProbeWaits while no slice is free."""
    job = RenderJob.objects.select_related("owner").get(pk=job_id)
    if job.state != State.ESTIMATING:
        return job
    _probe_heard_of(job_id)  # it runs (or waits for a slice): reconciliation leaves it be
    taken = _probe_slice(job)
    if taken is None:
        return job
    try:
        orders.wait_for_slice(taken.pk)  # its host's agent makes its MIG instance
    except orders.OrderFailed as failed:
        holdings.end(taken.pk, None, "its GPU instance was not made")
        raise ProbeWaits(failed.reason) from None
    run = kubejobs.probe_run()
    watched = kubejobs.watched_for(
        taken, job, run, output_bytes=settings.RENDER_MAX_OUTPUT_BYTES, wall_time_s=settings.RENDER_PROBE_WALL_SECONDS
    )
    watched.on_started = lambda at: _probe_started(job_id, taken.pk, watched, at)
    found: Probe | Exception | None = None
    try:
        found = _probe(job, taken, watched, run)
    finally:  # whatever happened, the slice is released; cut off (None), the job waits to be sent again
        job = _estimated(job_id, found, taken.pk, watched)
    return job


def _probe(job: RenderJob, taken: Slice, watched: containers.Watched | JobRuntime, run: str) -> Probe | Exception:
    frames = estimates.probe_frames(list(job.frames))
    output = stores.current().output_for(job, run)  # the worker's scratch: for the local store, the job's folder
    try:
        output.parent.mkdir(mode=0o700, exist_ok=True)  # never the job's: a job cancelled meanwhile has none left
        output.mkdir(mode=0o700, exist_ok=True)
        return probe(
            watched,
            spec_for(taken, RENDER_IMAGE, labels=containers.labels(job.pk)),
            stores.current().fetch_scene(job),  # checked against what unpacking recorded
            output,
            render_settings(job, taken),
            frames=frames,
            limit_s=settings.RENDER_PROBE_SAMPLING_SECONDS / max(1, len(frames)),
            wall_time_s=settings.RENDER_PROBE_WALL_SECONDS,
            output_limit=settings.RENDER_MAX_OUTPUT_BYTES,
        )
    except (SceneUnreadable, RuntimeError_, FileNotFoundError, ValueError, filestore.StoreUnreachable) as error:
        return error
    finally:
        with contextlib.suppress(OSError):
            files.remove_entry(output)


def _probe_started(job_id: int, slice_id: int, watched: containers.Watched | JobRuntime, at: datetime | None) -> None:
    """The probe's container started: its slice is held from then. If the job was cancelled meanwhile, the
    container is stopped here: the cancel may have looked for the job's containers before this one existed."""
    holdings.started(slice_id, at)
    if watched.container_id and not RenderJob.objects.filter(pk=job_id, state=State.ESTIMATING).exists():
        watched.kill(watched.container_id)


def no_slice_for_probe(job_id: int, reason: str) -> RenderJob:
    """The probe waited too long for a slice: the job fails, and says so."""
    return _estimated(job_id, Refused(f"No slice was free for the estimate: {reason}"))


def _estimated(
    job_id: int,
    found: Probe | Exception | None,
    slice_id: int | None = None,
    watched: containers.Watched | JobRuntime | None = None,
) -> RenderJob:
    """The probe ended: its slice's holding ends (at its container's end) in the same step as the job moves
    on, so a second task of the job, waiting for the row's lock, finds it estimated and probes nothing.
    None: the probe was cut off (its worker stopping); the job stays estimating, and the worker's restart or
    reconciliation sends its task again."""
    _remember_formats(found)  # before the job moves on: whoever sees it estimated sees what the build writes
    with transaction.atomic():
        job = locked(job_id)
        if slice_id is not None and watched is not None:
            holdings.end(slice_id, watched.finished_at, "render probe done", since=watched.started_at)
        if job.state != State.ESTIMATING or found is None:  # cancelled meanwhile, or cut off
            return job
        if isinstance(found, Exception):
            job.save(update_fields=job.move(State.FAILED, _probe_failure(found)))
            # Nothing of it can ever render (re-queueing needs rendered frames): its scene goes, its row stays.
            transaction.on_commit(lambda: jobs.remove_files(job), robust=True)
        else:
            _write_estimate(job, found)
            job.save(update_fields=job.move(State.AWAITING_CONFIRMATION))
        progress.announce(job)
    return job


def _remember_formats(found: Probe | Exception | None) -> None:
    """What the probe's Blender said it writes, for the upload form to offer (a failed probe says it too)."""
    formats = found.result.formats if isinstance(found, Probe) else getattr(found, "formats", None)
    if formats is not None:
        cache.set(FORMATS_KEY, list(formats), FORMATS_KEPT_S)


def _probe_failure(error: Exception) -> str:
    if isinstance(error, SceneTooLarge):
        return (
            f"{error}; this portal renders at most {error.max_side} pixels on a side "
            "(PORTAL_RENDER_MAX_RESOLUTION). Choose a lower resolution percentage, or lower the scene's resolution."
        )
    if isinstance(error, SceneUnreadable):
        return f"{error}\n\n{error.excerpt}".strip()
    if isinstance(error, Refused):
        return str(error)
    log.warning("render probe could not run: %s", error)
    return f"The probe could not run: {error}"


def commitment(job: RenderJob, frames: int) -> Decimal | None:
    """What rendering ``frames`` of the job comes to by its estimate, at the offer's rate now (None without an
    estimate or a price): each started minute of every slice it would hold, the estimate's own rule
    (``sessions.render.estimates``). What its owner commits to by confirming it or queueing frames again."""
    found = estimate_of(job)
    rate = pricing.current().per_minute(job.request, job.market)
    if found is None or rate is None:
        return None
    planned = estimates.plan(frames, job.chunk_size, job.max_slices, found.seconds_per_frame, found.overhead_s)
    return rate * planned.minutes


def _write_estimate(job: RenderJob, found: Probe) -> None:
    """The job's time and cost from what its probe measured (``sessions.render.estimates``)."""
    device = found.result.device or "CPU"
    at_once = estimates.slices_for(job.frame_count, job.chunk_size, job.max_slices)
    shared = estimates.sharing(at_once, found.threads, found.host_cpus or 0, on_cpu=device == "CPU")
    per_frame = shared.frame(found.seconds_per_frame, found.sampling_per_frame)
    overhead = found.overhead_s * shared.serial
    planned = estimates.plan(job.frame_count, job.chunk_size, job.max_slices, per_frame, overhead)
    rate = pricing.current().per_minute(job.request, job.market)
    estimate = Estimate(
        facts={**asdict(found.facts), "version": list(found.facts.version)},
        device=device,
        probe_samples=job.samples or found.facts.samples,
        seconds_per_frame=round(per_frame, 2),
        overhead_s=round(overhead, 2),
        frames=job.frame_count,
        chunks=planned.chunks,
        slices=planned.slices,
        total_seconds=round(planned.total_seconds, 1),
        cost=progress.shown(None if rate is None else rate * planned.minutes),
        why_cpu=_why_cpu(found) if device == "CPU" else "",
        probe_frames=found.frames,
        projected_frames=found.stopped,
        slowdown=round(shared.sampling, 2),
        minutes=planned.minutes,
    )
    (job.folder_path() / ESTIMATE_FILE).write_text(json.dumps(asdict(estimate)))


def _why_cpu(found: Probe) -> str:
    """Why the probe rendered on the CPU: each GPU backend's reason it was passed over, or none was tried
    (a simulated GPU has no device for Cycles to find)."""
    notes = found.result.device_notes
    return "; ".join(notes) if notes else "this slice's GPU is simulated"


def estimate_of(job: RenderJob) -> Estimate | None:
    """The job's estimate, once its probe has run (on a GPU host of its own, as its scene's fetch brought it)."""
    path = stores.current().scratch(job) / ESTIMATE_FILE
    try:
        found = json.loads(path.read_text())
        for frames in ("probe_frames", "projected_frames"):
            found[frames] = tuple(found.get(frames, ()))
        return Estimate(**found)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


# Confirming, and cutting the job into chunks ------------------------------------------------------------


def split(frames: list[int], chunk_size: int) -> list[list[int]]:
    """Frames in chunks of ``chunk_size``, in order."""
    size = max(1, chunk_size)
    return [frames[start : start + size] for start in range(0, len(frames), size)]


def confirm(job_id: int, by: User) -> RenderJob:
    """Its owner accepts the estimate: the job is queued, its frames and chunks recorded, slices sought."""
    with transaction.atomic():
        job = locked(job_id)
        if job.state != State.AWAITING_CONFIRMATION:
            raise Refused(f"A job that is {job.get_state_display().lower()} cannot be confirmed.")
        _may_commit(job, job.frame_count, "this render job's estimate")
        job.save(update_fields=job.move(State.QUEUED))
        RenderFrame.objects.bulk_create([RenderFrame(job=job, number=number) for number in job.frames])
        _add_chunks(job, list(job.frames), first_index=0)
        send_on_commit(DISPATCH_JOB, job_id)
        progress.announce(job)
    return job


def _may_commit(job: RenderJob, frames: int, what: str) -> None:
    """Refused unless its owner may still launch (their role) and whoever bills lets them commit to what the
    frames come to by the estimate (``workloads.gate``: the whole of it, every slice it may hold), under the
    owner's row lock, so two confirmations at once never both spend the same credit."""
    if not can_launch(job.owner):
        raise Refused(launch_refusal())
    User.objects.select_for_update().filter(pk=job.owner_id).first()
    cost = commitment(job, frames)
    refusal = workloads.gate().commitment_refusal(job.owner, cost, what) if cost is not None else None
    if refusal:
        raise Refused(refusal)


def _add_chunks(job: RenderJob, frames: list[int], first_index: int) -> None:
    RenderChunk.objects.bulk_create(
        [
            RenderChunk(job=job, index=first_index + number, frames=chunk)
            for number, chunk in enumerate(split(frames, job.chunk_size))
        ]
    )


def requeue_failed(job_id: int) -> RenderJob:
    """Queue a failed job's frames that are not done again, in new chunks; the done ones stay."""
    with transaction.atomic():
        job = locked(job_id)
        if job.state != State.FAILED:
            raise Refused(f"Only a failed job's frames can be queued again; this one is {job.get_state_display()}.")
        if not job.frame_results.exists():
            raise Refused("This job failed before it rendered anything; upload the scene again.")
        if job.files_removed_at is not None:
            raise Refused(f"This job's files were removed on {job.files_removed_at:%Y-%m-%d}; upload the scene again.")
        missing = list(job.frame_results.exclude(state=FrameState.DONE).values_list("number", flat=True))
        if not missing:
            raise Refused("Every frame of this job is done.")
        _may_commit(job, len(missing), f"rendering its {len(missing)} frames that are not done")
        job.save(update_fields=job.move(State.QUEUED))
        job.frame_results.filter(number__in=missing).update(state=FrameState.PENDING)
        last = job.chunks.order_by("-index").values_list("index", flat=True).first()
        _add_chunks(job, sorted(missing), first_index=(last or 0) + 1)
        send_on_commit(DISPATCH_JOB, job_id)
        progress.announce(job)
    return job


# Slices: allocating, holding, releasing -------------------------------------------------------------------


def held_by(job_id: int) -> list[Slice]:
    return list(progress.slices_of(job_id).filter(released_at__isnull=True).select_related("gpu__host").order_by("pk"))


def stop_job(job: RenderJob) -> None:
    """The job ended: its waiting chunks never run, its running ones are stopped once this commits (their
    workers then release their slices)."""
    job.chunks.filter(state=ChunkState.PENDING).update(state=ChunkState.CANCELLED, finished_at=timezone.now())
    job.frame_results.filter(state=FrameState.RENDERING).update(state=FrameState.PENDING)
    job_id = job.pk
    transaction.on_commit(lambda: stop_and_release(job_id, "render job ended"), robust=True)


def stop_and_release(job_id: int, reason: str) -> None:
    """Stop the job's containers and release its slices, each holding ending when its container did."""
    held = held_by(job_id)
    ended: dict[str, datetime | None] = {}
    for endpoint in engines.endpoints_for(held):
        try:
            runtime = containers.runtime_at(endpoint)  # each of its hosts' engines (sessions.runtime.engines)
            ended[endpoint] = containers.stop(runtime, containers.of_job(runtime, job_id))
        except (RuntimeError_, OSError) as error:  # that engine does not answer: its holdings end at their last proof
            log.error("render job %s: cannot stop its containers on %s: %s", job_id, endpoint or "this machine", error)
            ended[endpoint] = None
    for taken in held:
        holdings.end(taken.pk, ended[engines.endpoint_of(taken.gpu.host.name)], reason)
