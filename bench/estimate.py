"""A render job's estimate against the render it estimates, in one run: issue 30's figures (BENCH.md).

Each case is a job written as an upload leaves it (checked, its samples chosen), sent to its probe by the
real render worker in the render sandbox (``services.request_estimate``), then confirmed and rendered on
slices of the simulated fleet (Cycles on the CPU). The baseline is that render, measured in the same run
straight after its estimate: the time its slices were held (the longest holding, each from its first
container's start to its last one's end, as Docker recorded them: what the meter bills) against the
estimate's total time, and the cost of those holdings at their frozen rates against the estimate's cost.

Cases: the render benchmark's scene (320x240, the default cube turning over 24 frames) in one chunk, in
chunks of 8, and on 2 slices in chunks of 12; a scene of 3 frames in chunks of 2. Each at --low and --high
samples (16 and 65,536: Blender 3.4's Cycles samples adaptively by default, so most pixels stop long before
65,536). Headline: the case whose estimate is furthest from its render, as estimate / render; goal: every
case within 25 % (0.75 <= ratio <= 1.25), every job done.

Runs on a portal of its own (``bench.render.render_portal``: database, data folder, queues, workers);
logs: artifacts/logs/bench-render-*.log.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.render import SCENE_SCRIPT, Workers, docker, median_gap, render_portal
from bench.report import Result
from bench.server import ROOT, BenchFailed, run_checked

IMAGE = "gpu-portal/render:latest"
WITHIN = 0.25
# (name, frames, chunk size, slices)
SHAPES = [("24 frames, 1 chunk", 24, 24, 1), ("24 frames, chunks of 8", 24, 8, 1),
          ("24 frames, 2 slices", 24, 12, 2), ("3 frames, chunks of 2", 3, 2, 1)]  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--low", type=int, default=16, help="the low sample count (default 16)")
    parser.add_argument("--high", type=int, default=65536, help="the high sample count (default 65536)")
    parser.add_argument("--only", default="", help="cases whose name holds this text (default: all)")


def make_scene(folder: Path, frames: int) -> Path:
    """The render benchmark's scene, ``frames`` long, at Blender's own 4,096 samples (each job sets its own)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = SCENE_SCRIPT.format(samples=4096, width=320, height=240, frames=frames)
    docker("run", "--rm", "--network", "none", "--user", "root", "-v", f"{folder}:/out", IMAGE, "blender", "-b",
           "--factory-startup", "--python-expr", script)  # fmt: skip
    return folder / "scene.blend"


def job(env: dict[str, str], workers: Workers, scene: Path, shape: tuple[str, int, int, int], samples: int) -> Any:
    _, frames, chunk_size, slices = shape
    command = [sys.executable, "-m", "bench.estimate_job", str(scene), str(frames), str(chunk_size), str(slices)]
    command += [str(samples), *workers.names]
    output = run_checked(command, "bench.estimate_job", cwd=ROOT, env=env, timeout=1200)
    return json.loads(output.stdout.strip().splitlines()[-1])


def case(run: dict[str, Any], shape: tuple[str, int, int, int], samples: int) -> dict[str, Any]:
    estimate, held = run["estimate"], run["holdings"]
    held_s = max((h["held_s"] or 0.0 for h in held), default=0.0)
    cost = sum((Decimal(h["cost"]) for h in held if h["cost"] is not None), Decimal(0))
    gap = median_gap(run["frame_mtimes"])
    return {
        "case": f"{shape[0]}, {samples} samples",
        "complete": run["state"] == "done" and run["frames_done"] == shape[1],
        "estimated_s": estimate["total_seconds"],
        "rendered_s": round(held_s, 3),
        "ratio": round(estimate["total_seconds"] / held_s, 3) if held_s else None,
        "estimated_cost": estimate["cost"],
        "charged_cost": f"{cost:.2f}",
        "estimated_minutes": estimate.get("minutes"),
        "per_frame_s": {"estimated": estimate["seconds_per_frame"], "frame_gap_median": gap},
        "overhead_s": estimate["overhead_s"],
        "slowdown": estimate.get("slowdown"),
        "chunks": run["chunks"],
        "slices": [h["held_s"] for h in held],
        "probe_frames": estimate.get("probe_frames"),
        "projected_frames": estimate.get("projected_frames"),
        "probe_wall_s": run["probe_wall_s"],
        "failure": run["failure"] or None,
    }


def measure(args: argparse.Namespace, env: dict[str, str], tmp: Path, workers: Workers) -> list[dict[str, Any]]:
    scenes = {frames: make_scene(tmp / f"scene-{frames}", frames) for frames in sorted({s[1] for s in SHAPES})}
    cases = []
    for shape in SHAPES:
        for samples in (args.low, args.high):
            if args.only and args.only not in f"{shape[0]}, {samples} samples":
                continue
            found = case(job(env, workers, scenes[shape[1]], shape, samples), shape, samples)
            print(json.dumps(found), file=sys.stderr)
            cases.append(found)
    return cases


def report(cases: list[dict[str, Any]]) -> Result:
    if not cases:
        raise BenchFailed("no case chosen (--only)")
    complete = all(c["complete"] and c["ratio"] is not None for c in cases)
    worst = max(cases, key=lambda c: abs((c["ratio"] or 0) - 1))
    within = complete and all(1 - WITHIN <= c["ratio"] <= 1 + WITHIN for c in cases)
    details = {
        "cases": cases,
        "ratios": {c["case"]: c["ratio"] for c in cases},
        "median_ratio": round(statistics.median(c["ratio"] or 0 for c in cases), 3),
        "costs_equal": sum(c["estimated_cost"].split(" ")[0] == c["charged_cost"] for c in cases),
        "note": "rendered_s is the longest of the job's render slices' holdings (first container's start to "
        "last one's end, as Docker recorded them); the probe's own slice is not counted",
    }
    print(json.dumps(details, indent=2))
    return Result(
        name="estimate",
        metric="worst_case_estimated_s",
        value=worst["estimated_s"],
        baseline_name=f"the render it estimated, same run ({worst['case']})",
        baseline=worst["rendered_s"],
        better="lower",
        goal=f"{1 - WITHIN:g} <= estimate / render <= {1 + WITHIN:g} in every case, every job done",
        goal_ratio=1 + WITHIN if within else -1.0,  # one case out of bounds (either way) or a failed job: not met
        unit="s",
        details=details,
    )


def run(args: argparse.Namespace) -> Result:
    with render_portal("estimate") as (env, workers, tmp):
        cases = measure(args, env, tmp, workers)
    result = report(cases)
    result.write()
    return result


if __name__ == "__main__":
    raise BenchFailed("run it as: python -m bench estimate")
