"""Render work after a crash: the render and estimate workers' restarts, and reconciliation every half minute.

At its start the render worker finds the chunks it was rendering (their workers died with it): their
containers are stopped and the chunks wait again, without losing an attempt; the slices those workers held
are released, each holding ending at its last proof of life (the last line its worker read), so nobody pays
for the time a dead worker held them, and each job is given slices and workers again. The estimate worker,
at its start, sends the probes it was running again (their slices released at their last proof of life).
Reconciliation frees what a crashed job left: slices a finished (or vanished) job still holds, containers of
jobs that ended, chunks whose container is gone (their slice released at its last proof of life); seeks slices
for jobs that wait, puts back the chunks of a host whose render worker is gone (no running worker reads its
queue, ``PORTAL_RENDER_WORKER_SILENCE_S``) for the other hosts' workers, releases slices nobody has worked on
for a while (their worker died between chunks) and sends workers to slices never started; and sends the
estimate, or the unpacking of an upload, again where its task was lost (a broker that did not answer the
upload, a worker that died).
As with notebooks (sessions/notebooks/reconcile.py), safe to run at any time.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.celery import send
from sessions.gpus import holdings
from sessions.gpus.holders import HolderKind
from sessions.gpus.models import GpuHost, Slice
from sessions.render import containers, jobs, progress, queues, services, slices, unpacking
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.runtime import engines
from sessions.runtime.docker import RuntimeError_

log = logging.getLogger(__name__)
# A chunk's worker removes its container, then records the chunk: a chunk seen rendering without a
# container is put back only once this much has passed since it began.
GRACE = timedelta(minutes=2)
# A probe's task that waits for a slice runs again every half minute and says so (``estimate_sent_at``): one
# not heard of for this long, with no probe running, was lost with its message.
ESTIMATE_SILENCE = timedelta(minutes=10)
ChunkState = RenderChunk.State


def put_back(chunk_id: int, count_attempt: bool) -> bool:
    """A rendering chunk whose worker is gone waits again (its frames not done with it)."""
    with transaction.atomic():
        chunk = RenderChunk.objects.select_for_update().filter(pk=chunk_id, state=ChunkState.RENDERING).first()
        if chunk is None:
            return False
        chunk.state = ChunkState.PENDING
        if not count_attempt:
            chunk.attempts = max(0, chunk.attempts - 1)
        chunk.save(update_fields=["state", "attempts"])
        frames = RenderFrame.objects.filter(job_id=chunk.job_id, number__in=chunk.frames)
        frames.filter(state=RenderFrame.State.RENDERING).update(state=RenderFrame.State.PENDING)
    return True


def recover_after_restart(host: str | None = None) -> dict[str, int]:
    """The render worker of ``host``'s machine has just started (``sessions.render.queues``), so none of its
    workers runs: every chunk rendering on that host was cut off, and every slice there that a queued or
    rendering job holds was held by a worker that is gone. Other hosts' chunks are their own workers' (one
    render worker per host's machine); None: every host's (a message sent before hosts had queues of their
    own). Probes run elsewhere (``restart_probes``)."""
    counts = {"chunks_put_back": 0, "workers_sent": 0, "slices_released": 0}
    rendering = RenderChunk.objects.filter(state=ChunkState.RENDERING).select_related("slice__gpu__host")
    held = Slice.objects.filter(released_at__isnull=True, holder_kind=HolderKind.RENDER)
    held = held.filter(holder_id__in=RenderJob.objects.filter(state__in=services.RUNNING).values("pk"))
    if host is not None:
        rendering = rendering.filter(slice__gpu__host__name=host)
        held = held.filter(gpu__host__name=host)
    touched: set[int] = set()
    for chunk in rendering:
        runtime = containers.of_slice(chunk.slice)
        containers.stop(runtime, containers.of_chunk(runtime, chunk.pk))
        for container_id in containers.of_chunk(runtime, chunk.pk):
            runtime.remove(container_id)
        counts["chunks_put_back"] += int(put_back(chunk.pk, count_attempt=False))
        touched.add(chunk.job_id)
    for taken in held.order_by("pk"):
        holdings.end(taken.pk, None, "its render worker stopped")  # at its last proof of life
        counts["slices_released"] += 1
        assert taken.holder_id is not None  # a render holding names its job
        touched.add(taken.holder_id)
    for job_id in sorted(touched):
        counts["workers_sent"] += slices.dispatch(job_id)
    return counts


def restart_probes() -> dict[str, int]:
    """The estimate worker has just started, so no probe runs: each job left estimating has what its probe
    left stopped and released, and its probe sent again. (One estimate worker per portal: the supervisor's
    `estimate` program.)"""
    jobs = list(RenderJob.objects.filter(state=RenderJob.State.ESTIMATING).values_list("pk", flat=True))
    for job_id in jobs:
        _restart_probe(job_id)
    return {"probes_restarted": len(jobs)}


def _restart_probe(job_id: int) -> None:
    held = services.held_by(job_id)
    for runtime in map(containers.runtime_at, engines.endpoints_for(held)):
        found = containers.of_job(runtime, job_id)
        containers.stop(runtime, found)
        for container_id in found:
            runtime.remove(container_id)
    for taken in held:
        holdings.end(taken.pk, None, "render probe cut off")  # at its last proof of life, not the stop
    services.send_estimate(job_id)


def reconcile() -> dict[str, int]:
    """Every half minute, on the default queue: each container is looked for on its slice's host's engine, and
    an engine that does not answer leaves its hosts' chunks and containers as they are (nothing is put back
    or removed on a word nobody said)."""
    counts = {"slices_released": 0, "containers_removed": 0, "chunks_put_back": 0, "workers_sent": 0}
    counts["estimates_sent"] = _send_lost_estimates()
    counts["unpacking_sent"] = _send_lost_unpacking()
    counts["slices_released"] = _release_leftover_slices()
    counts["containers_removed"] = _remove_leftover_containers()
    counts["chunks_put_back"] = _put_back_lost_chunks()
    counts["hosts_recovered"] = _recover_hosts_without_worker()
    waiting = RenderJob.objects.filter(state__in=services.RUNNING, chunks__state=ChunkState.PENDING).distinct()
    for job_id in waiting.values_list("pk", flat=True):
        if _wants_workers(job_id):
            counts["workers_sent"] += slices.dispatch(job_id)
    return counts


def _recover_hosts_without_worker() -> int:
    """A host with chunks rendering whose render queue no running worker has read for
    PORTAL_RENDER_WORKER_SILENCE_S lost its render worker mid-chunk (killed, its machine cut off): what a restart
    of that worker would do is done now (``recover_after_restart``: its chunks' containers stopped, the chunks
    put back without losing an attempt, its slices released at their last proof of life), so the other hosts'
    workers render them. A host whose engine does not answer is left as it is: a container that may still run
    keeps its GPU, and its slice stays held."""
    rendering = RenderChunk.objects.filter(state=ChunkState.RENDERING, slice__isnull=False)
    hosts = set(rendering.values_list("slice__gpu__host__name", flat=True))
    read = queues.hosts_read() if hosts else None
    if read is None:
        return 0
    recovered, now = 0, time.time()
    for host in sorted(hosts):
        key = f"render-worker-missing:{host}"
        if host in read:
            cache.delete(key)
            continue
        # Since when it is missing: the first look that missed it, forgotten a while after (a host seen missing
        # once, long ago, is not missing since then).
        cache.add(key, now, timeout=settings.RENDER_WORKER_SILENCE_S + 120)
        if now - float(cache.get(key, now)) < settings.RENDER_WORKER_SILENCE_S:
            continue
        log.warning("no render worker reads the queue of %s: its chunks are put back for other hosts", host)
        try:  # the engine's first answer comes before anything is put back
            recover_after_restart(host)
        except (RuntimeError_, OSError) as error:
            log.error("the engine of %s does not answer either; its chunks stay as they are: %s", host, error)
            continue
        cache.delete(key)
        recovered += 1
    return recovered


def _wants_workers(job_id: int) -> bool:
    """A job whose chunks wait and that holds no slice, or holds one nobody has worked on for a while: its
    worker's task was lost (the broker did not take it just after the slice was allocated), or its worker died
    between chunks. A slice whose holding began is released first, its holding ending at its last proof of
    life (the time nobody worked on it is not charged), and dispatch then allocates afresh; one never started
    gets a worker. A worker sent to a slice another one works on finds it busy and returns, so sending one too
    many costs nothing."""
    held = services.held_by(job_id)
    if not held:
        return True
    since = timezone.now() - GRACE
    chunks = RenderChunk.objects.filter(job_id=job_id)
    busy = set(
        chunks.filter(Q(state=ChunkState.RENDERING) | Q(finished_at__gte=since)).values_list("slice_id", flat=True)
    )
    idle = [taken for taken in held if taken.pk not in busy and taken.allocated_at < since]
    for taken in idle:
        if taken.held_from is not None:
            holdings.end(taken.pk, None, "nobody worked on it: its render worker stopped")
    return bool(idle)


def _send_lost_estimates() -> int:
    """Jobs left checked (their step to the probe never taken), or estimating with no probe running whose task
    never reached the broker or has not been heard of for long: their estimate is sent (again). A task sent
    twice probes once (``services.estimate`` takes the job's lock and looks)."""
    now = timezone.now()
    checked = RenderJob.objects.filter(state=RenderJob.State.VALIDATED, created_at__lt=now - GRACE)
    silent = Q(estimate_sent_at__isnull=True) | Q(estimate_sent_at__lt=now - ESTIMATE_SILENCE)
    estimating = RenderJob.objects.filter(silent, state=RenderJob.State.ESTIMATING)
    sent = 0
    for job_id in [*checked.values_list("pk", flat=True), *estimating.values_list("pk", flat=True)]:
        if services.held_by(job_id):
            continue  # its probe runs
        try:
            services.resume_estimate(job_id)
        except Exception as error:  # one job's send must not stop the rest
            log.error("render job %s: could not send its estimate: %s", job_id, error)
            continue
        sent += 1
    return sent


def _send_lost_unpacking() -> int:
    """Jobs waiting to be unpacked that nobody has heard of for a while: their task never reached the broker, or
    its worker died mid-way. A task sent twice unpacks once (``unpacking.claim``)."""
    cutoff = timezone.now() - unpacking.SILENCE
    quiet = Q(unpack_sent_at__isnull=True) | Q(unpack_sent_at__lt=cutoff)
    silent = Q(unpack_heard_at__isnull=True) | Q(unpack_heard_at__lt=cutoff)
    sent = 0
    for job_id in RenderJob.objects.filter(quiet, silent, state=RenderJob.State.UNPACKING).values_list("pk", flat=True):
        try:
            send(jobs.UNPACK_JOB, job_id, noted=functools.partial(jobs.unpack_sent, job_id))
        except Exception as error:  # the broker is away: the next run tries again
            log.error("render job %s: could not send its unpacking: %s", job_id, error)
            continue
        sent += 1
    return sent


def _release_leftover_slices() -> int:
    """Slices held for jobs that ended or no longer exist (their worker crashed before it released them)."""
    held = Slice.objects.filter(released_at__isnull=True, holder_kind=HolderKind.RENDER).select_related("gpu__host")
    live = RenderJob.objects.exclude(state__in=RenderJob.ENDED).values("pk")
    released = 0
    for taken in held.exclude(holder_id__in=live):
        assert taken.holder_id is not None
        try:
            runtime = engines.for_slice(taken)
            ended = containers.stop(runtime, containers.of_job(runtime, taken.holder_id))
            holdings.end(taken.pk, ended, "its render job had ended")
        except Exception as error:  # one slice that cannot be freed (its engine away) must not stop the rest
            log.error("slice %s: could not release it: %s", taken.pk, error)
            continue
        released += 1
    return released


def _remove_leftover_containers() -> int:
    """Containers of render jobs that ended, once their worker had time to remove them itself: on each
    engine, one that does not answer left for the next run."""
    removed = 0
    ended = RenderJob.objects.filter(state__in=RenderJob.ENDED, finished_at__lt=timezone.now() - GRACE)
    for endpoint, hosts in engines.by_engine(GpuHost.objects.values_list("name", flat=True)).items():
        try:
            runtime = containers.runtime_at(endpoint)
            for container_id in runtime.containers_for(containers.JOB_LABEL):
                job_id = containers.job_of(runtime, container_id)
                if job_id is not None and ended.filter(pk=job_id).exists():
                    runtime.remove(container_id)
                    removed += 1
        except (RuntimeError_, OSError) as error:
            log.error("the Docker engine of %s cannot be reached: %s", ", ".join(hosts) or "this machine", error)
    return removed


def _put_back_lost_chunks() -> int:
    """Rendering chunks long after they began whose container is gone, or ended a while ago: their worker
    died (a live one removes its container and records the chunk within moments of its end). A chunk whose
    host's engine does not answer is left as it is: nobody said its container was gone."""
    lost = 0
    since = timezone.now() - GRACE
    stale = RenderChunk.objects.filter(state=ChunkState.RENDERING, started_at__lt=since)
    for chunk in stale.exclude(job__state__in=RenderJob.ENDED).select_related("job", "slice__gpu__host"):
        try:
            runtime = containers.of_slice(chunk.slice)
            found = containers.of_chunk(runtime, chunk.pk)
        except (RuntimeError_, OSError) as error:
            log.error("render chunk %s: its host's Docker engine cannot be reached: %s", chunk.pk, error)
            continue
        states = [containers.inspect(runtime, container_id) for container_id in found]
        if any(state is not None and (state.running or (state.finished_at or since) > since) for state in states):
            continue
        for container_id in found:
            runtime.remove(container_id)
        if put_back(chunk.pk, count_attempt=True):
            lost += 1
            if chunk.slice_id is not None:  # its worker died: the slice's holding ends at its last proof of life
                holdings.end(chunk.slice_id, None, "its render worker stopped")
            progress.announce(chunk.job)
            slices.dispatch(chunk.job_id)
    return lost
