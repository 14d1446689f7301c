"""Child process of the estimate benchmark: one render job through the portal, from its probe to its end.

Usage: ``python -m bench.estimate_job SCENE FRAMES CHUNK_SIZE SLICES SAMPLES WORKER...``. Waits until the
named Celery workers answer, writes a job whose upload was checked (``validated``, SAMPLES its samples),
sends it to its probe as an upload does (``services.request_estimate``), reads the estimate, confirms it
through ``services.confirm`` as the job page does, and follows it until it ended and its slices were
released. Prints one JSON line: the estimate, each render slice's holding (what the meter bills) and its
cost at its frozen rate, and the frames' files' times.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()


from bench.render_job import bench_user, new_job, workers_answer  # noqa: E402
from sessions.gpus import pricing  # noqa: E402
from sessions.render import progress, services  # noqa: E402
from sessions.render.models import RenderChunk, RenderFrame, RenderJob  # noqa: E402

TIMEOUT_S = 900


def until(job: RenderJob, done: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if done(job):
            return
        time.sleep(0.1)
    raise SystemExit(f"{what}: not within {TIMEOUT_S} s (job {job.pk} is {job.state})")


def holdings(job: RenderJob, probe_slice: int) -> list[dict[str, Any]]:
    """Each render slice's holding, from its first container's start to its last one's end, and its cost."""
    held = [taken for taken in progress.slices_of(job.pk).order_by("pk") if taken.pk != probe_slice]
    costs = pricing.current().costs_so_far(held)
    return [
        {
            "slice": taken.pk,
            "held_s": (taken.held_until - taken.held_from).total_seconds()
            if taken.held_from and taken.held_until
            else None,
            "cost": str(costs.get(taken.pk)) if costs.get(taken.pk) is not None else None,
        }
        for taken in held
    ]


def main(argv: list[str]) -> int:
    scene, count, chunk_size, slices, samples = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    workers_answer(argv[5:])
    owner = bench_user("bench-estimate")
    job = new_job(
        owner, scene, list(range(1, count + 1)), chunk_size, slices, RenderJob.State.VALIDATED, samples=samples
    )
    probe_began = time.time()
    services.request_estimate(job.pk)
    until(job, lambda j: j.state != RenderJob.State.ESTIMATING, "the estimate")
    probe_s = time.time() - probe_began
    estimate = services.estimate_of(job)
    if job.state != RenderJob.State.AWAITING_CONFIRMATION or estimate is None:
        raise SystemExit(f"the probe failed: {job.failure_message[:2000]}")
    [probe_slice] = list(progress.slices_of(job.pk))
    services.confirm(job.pk, owner)
    until(job, lambda j: j.state in RenderJob.ENDED, "the render")
    until(job, lambda j: not services.held_by(j.pk), "its slices released")
    rows = list(RenderFrame.objects.filter(job=job).order_by("number"))
    files = [job.folder_path() / row.output_path for row in rows if row.output_path]
    print(
        json.dumps(
            {
                "job": job.pk,
                "state": job.state,
                "failure": job.failure_message[:2000],
                "probe_wall_s": round(probe_s, 3),
                "estimate": dataclasses.asdict(estimate),
                "holdings": holdings(job, probe_slice.pk),
                "chunks": RenderChunk.objects.filter(job=job).count(),
                "frames_done": sum(row.state == RenderFrame.State.DONE for row in rows),
                "frame_mtimes": sorted(path.stat().st_mtime for path in files if path.is_file()),
            }
        )
    )
    shutil.rmtree(job.folder_path(), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
