"""What a render job's followers see, live: frames done of total, the current frame's samples, the average
time per frame, the time left, the cost so far, the latest thumbnail and the end of Blender's output.

``snapshot`` reads the figures from the rows (any page can show them on load); ``ChunkRun`` keeps what only
the running chunk knows (the sample reached, the log tail) and pushes, at most a few times a second, through
``portal.push.render_progress``; what it pushes is also kept in the cache, so a page loaded between two
pushes shows the sample reached and the log tail at once (once no chunk runs, the last chunk's own excerpt
stands in for the tail). Cost so far is each of the job's slices' started minutes, from its recorded holding,
at the rate the meter freezes on it (the pricing seam billing fills); the meter charges the same minutes at
the same rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import models, transaction
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from portal import push
from sessions.gpus import pricing
from sessions.gpus.holders import HolderKind
from sessions.gpus.models import Slice
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.runtime.blender_log import Event, FrameSaved, Marked, Progress

PUSH_EVERY_S = 0.5  # sample lines come many a second; a frame saved or a state change goes at once
TAIL_LINES = 12
TAIL_KEPT_S = 24 * 3600  # a running chunk's tail in the cache: rewritten at each push, gone a day after the last
SHOWN_QUANTUM = Decimal("0.01")  # as billing.money shows amounts: half up, two decimals, the currency


def slices_of(job_id: int) -> Any:
    return Slice.objects.filter(holder_kind=HolderKind.RENDER, holder_id=job_id)


def cost_so_far(job: RenderJob) -> Decimal | None:
    """Each started minute of each slice the job held or holds, at its frozen rate; None if unpriced."""
    return costs_so_far([job.pk]).get(job.pk)


def costs_so_far(job_ids: Iterable[int]) -> dict[int, Decimal | None]:
    """``cost_so_far`` of many jobs at once (the jobs list), in a fixed number of queries: one look at their
    slices, then the pricing seam's cost of each holding (the rate the meter freezes on it, each started
    minute by the database's clock). A job without a priced holding maps to None."""
    ids = list(job_ids)
    totals: dict[int, Decimal | None] = dict.fromkeys(ids)
    held = list(
        Slice.objects.filter(holder_kind=HolderKind.RENDER, holder_id__in=ids, held_from__isnull=False)
        .select_related("gpu__host")
        .order_by("pk")
    )
    costs = pricing.current().costs_so_far(held)
    for holding in held:
        if holding.pk in costs and holding.holder_id is not None:
            totals[holding.holder_id] = (totals[holding.holder_id] or Decimal(0)) + costs[holding.pk]
    return totals


def shown(amount: Decimal | None) -> str:
    if amount is None:
        return ""
    return f"{amount.quantize(SHOWN_QUANTUM, rounding=ROUND_HALF_UP):,} {settings.CURRENCY}"


def seconds_per_frame(job: RenderJob) -> float | None:
    """The average wall time of a finished frame: each from its chunk's start or the frame before it."""
    starts = dict(job.chunks.filter(started_at__isnull=False).values_list("pk", "started_at"))
    done = list(job.frame_results.filter(state=RenderFrame.State.DONE, finished_at__isnull=False))
    if not done or not starts:
        return None
    chunk_of = {frame: chunk.pk for chunk in job.chunks.all() for frame in chunk.frames}
    spans: list[float] = []
    previous: dict[int, datetime] = {}
    for frame in sorted(done, key=lambda item: item.finished_at or timezone.now()):
        chunk_id = chunk_of.get(frame.number)
        began = previous.get(chunk_id or 0) or starts.get(chunk_id or 0)
        if began is None or frame.finished_at is None or frame.finished_at < began:
            continue
        spans.append((frame.finished_at - began).total_seconds())
        previous[chunk_id or 0] = frame.finished_at
    return round(sum(spans) / len(spans), 2) if spans else None


def duration(seconds: float | None) -> str:
    """A time as the job's page shows it, loaded or live (the socket carries these words): under ten seconds to
    the hundredth (frames often take less than one: never "0 s"), then whole seconds, minutes, hours."""
    if seconds is None:
        return "—"
    if seconds < 10:
        return f"{seconds:.2f}".rstrip("0").rstrip(".") + " s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def percent_of(done: int, total: int) -> int:
    """Frames done as a whole percentage, rounded down: 100 only once every frame is done."""
    return math.floor(100 * done / total) if total else 0


def frames_done(job_ids: Iterable[int]) -> dict[int, int]:
    """Each job's finished frames, for many jobs in one query (the jobs list)."""
    ids = list(job_ids)
    counted = (
        RenderFrame.objects.filter(job_id__in=ids, state=RenderFrame.State.DONE)
        .values("job_id")
        .annotate(done=models.Count("pk"))
        .values_list("job_id", "done")
    )
    return {**dict.fromkeys(ids, 0), **dict(counted)}


def _live_key(job_id: int) -> str:
    return f"render:live:{job_id}"


def last_live(job_id: int) -> dict[str, Any]:
    """What a running chunk of the job pushed last (``ChunkRun.live``): kept so a page loaded between two
    pushes shows it at once."""
    kept = cache.get(_live_key(job_id))
    return kept if isinstance(kept, dict) else {}


def log_tail(job: RenderJob, live: dict[str, Any] | None = None) -> list[str]:
    """The end of Blender's output as the job's page shows it on load: the latest tail a chunk of it pushed,
    else the end of the last finished chunk's output."""
    kept = (last_live(job.pk) if live is None else live).get("log_tail")
    if kept:
        return [str(line) for line in kept]
    last = job.chunks.filter(finished_at__isnull=False).exclude(log_excerpt="").order_by("-finished_at").first()
    return last.log_excerpt.splitlines()[-TAIL_LINES:] if last else []


def _current_frame(job: RenderJob, live: dict[str, Any]) -> dict[str, Any]:
    """The frame being rendered, its sample reached and where Cycles renders, while the job renders."""
    rendering = job.state == RenderJob.State.RENDERING
    return {key: live.get(key) if rendering else None for key in ("frame", "sample", "samples", "device")}


def thumbnail_url(job_id: int, number: int) -> str:
    """Where the job page fetches a frame's thumbnail (empty until the results pages name that route)."""
    try:
        return reverse("render-frame-thumbnail", args=[job_id, number])
    except NoReverseMatch:
        return ""


def snapshot(job: RenderJob) -> dict[str, Any]:
    """The job's figures as its page and its socket show them."""
    frames = job.frame_results.all()
    done = frames.filter(state=RenderFrame.State.DONE).count()
    total = job.frame_count
    per_frame = seconds_per_frame(job)
    rendering = job.chunks.filter(state=RenderChunk.State.RENDERING).count()
    eta = None
    if per_frame is not None and not job.ended:
        eta = round((total - done) * per_frame / max(1, rendering), 1)
    latest = frames.filter(state=RenderFrame.State.DONE).exclude(thumbnail_path="").order_by("-finished_at").first()
    live = last_live(job.pk)
    return {
        "type": "render.progress",
        "job": job.pk,
        "state": job.state,
        "state_label": job.get_state_display(),
        "frames_done": done,
        "frames_total": total,
        "frames_failed": frames.filter(state=RenderFrame.State.FAILED).count(),
        "percent": percent_of(done, total),
        "seconds_per_frame": per_frame,
        "eta_seconds": eta,
        "per_frame_shown": duration(per_frame),
        "eta_shown": duration(eta),
        "cost": shown(cost_so_far(job)),
        "thumbnail": thumbnail_url(job.pk, latest.number) if latest and job.files_removed_at is None else "",
        "latest_frame": latest.number if latest else None,
        "failure": job.failure_message,
        "log_tail": log_tail(job, live),
        **_current_frame(job, live),
    }


def announce(job: RenderJob, live: dict[str, Any] | None = None) -> None:
    """Push the job's figures once the change is committed; a push that fails never undoes the change."""
    job_id, owner_id = job.pk, job.owner_id

    def send() -> None:
        if live and live.get("log_tail"):  # kept first, so the snapshot and a page loaded now show it too
            cache.set(_live_key(job_id), live, TAIL_KEPT_S)
        payload = snapshot(RenderJob.objects.get(pk=job_id))
        push.render_progress(owner_id, job_id, {**payload, **(live or {})})

    transaction.on_commit(send, robust=True)


@dataclass
class ChunkRun:
    """One chunk's run, as its lines come: the frame and sample reached, the log's tail; pushes as it goes.
    ``on_saved`` records a frame Blender said it saved (its file's name in the output folder), ``on_preview``
    the small PNG Blender then wrote of it (for a format Pillow cannot read)."""

    job: RenderJob
    on_saved: Callable[[str], None]
    on_preview: Callable[[int], None] | None = None  # Blender wrote its small PNG of this saved frame
    frame: int | None = None
    sample: int | None = None
    samples: int | None = None
    tail: list[str] = field(default_factory=list)
    last_push: float = 0.0
    sampled: set[int] = field(default_factory=set)  # frames whose sampling has been pushed once
    device: str | None = None  # where Cycles renders, as our Python in Blender said: CPU, CUDA, OPTIX

    def line(self, text: str, event: Event | None) -> None:
        if not isinstance(event, Marked):  # our own Python's lines carry the run's mark: not for the tail
            self.tail = [*self.tail[-(TAIL_LINES - 1) :], text[:500]]
        if isinstance(event, Progress):
            self.frame = event.frame
            first_sample = event.sample is not None and event.frame not in self.sampled
            if event.sample is not None:
                self.sample, self.samples = event.sample, event.samples
            if first_sample or time.monotonic() - self.last_push >= PUSH_EVERY_S:
                if first_sample:
                    self.sampled.add(event.frame)
                self.push()
        elif isinstance(event, Marked) and event.kind == "device" and isinstance(event.value, str):
            self.device = event.value[:16]
        elif isinstance(event, Marked) and event.kind == "preview" and type(event.value) is int and self.on_preview:
            self.on_preview(event.value)
            self.push()  # the frame's thumbnail is there now
        elif isinstance(event, FrameSaved):
            self.on_saved(event.path.rsplit("/", 1)[-1])
            self.sample = None
            self.push()

    def live(self) -> dict[str, Any]:
        return {
            "frame": self.frame,
            "sample": self.sample,
            "samples": self.samples,
            "device": self.device,
            "log_tail": self.tail,
        }

    def push(self) -> None:
        self.last_push = time.monotonic()
        announce(self.job, self.live())
