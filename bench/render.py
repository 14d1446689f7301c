"""A 24-frame render job through the portal against bare `blender -b` in the same image, in one run.

Issue 14's figures (BENCH.md): a small scene Blender makes inside the render image (low resolution, few
samples, a turning cube), rendered as a job on one MIG slice of the simulated fleet the way people's jobs
run: confirmed through ``services.confirm``, dispatched by a Celery worker on the default queue, its
chunks rendered by a real Celery render worker (threads, as the supervisor runs it) in the render sandbox.
Timed from the job's "queued" moment to its last frame saved (the frame's row done, its file and thumbnail
written). Baseline, in the same run and interleaved with the headline: the same frames of the same file by
one bare ``docker run ... blender -b scene.blend -a`` in the same image (no portal, no sandbox options),
from the `docker run` to its exit.

Headline: --chunk-size (24 by default: one chunk, one container), median of --rounds, against the
baseline's median; goal ratio <= 1.15. Besides it, each of --table's chunk sizes once, a fit of the time
against the number of chunks (the slope is what each chunk costs: a container, Blender's start, reading
the file, the claim), the per-frame overhead (the median time between consecutive frames' files, ours
against bare), and the same job on 2 slices at once (chunks of 12) with its speed-up over the best
one-slice time. A run where a frame was lost or a job failed has not met its goal.

Runs on a database of its own (dropped after), a data folder under /tmp, Redis database 9 unless
BENCH_REDIS_URL says otherwise, Celery queues and a Docker instance label of its own; its workers, their
containers and its folder go when it ends, on failure too. Logs: artifacts/logs/bench-render-*.log.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from bench.report import Result
from bench.server import BIN, LOGS, ROOT, BenchFailed, run_checked, stop_process

DOCKER = "/usr/bin/docker"
IMAGE = "gpu-portal/render:latest"  # sessions.runtime.render.RENDER_IMAGE (this module stays free of Django)
GOAL_RATIO = 1.15
FLEET = "bench-render: 1xH200:mig"

# Blender makes the scene in the image (trusted, outside the sandbox): the default cube turning over the frames.
SCENE_SCRIPT = """
import bpy
scene = bpy.context.scene
scene.render.engine = "CYCLES"
scene.cycles.samples = {samples}
scene.cycles.use_denoising = False
scene.render.resolution_x, scene.render.resolution_y, scene.render.resolution_percentage = {width}, {height}, 100
scene.render.image_settings.file_format = "PNG"
scene.frame_start, scene.frame_end = 1, {frames}
cube = bpy.data.objects["Cube"]
cube.keyframe_insert("rotation_euler", frame=1)
cube.rotation_euler[2] = 3.0
cube.keyframe_insert("rotation_euler", frame={frames})
bpy.ops.wm.save_as_mainfile(filepath="/out/scene.blend")
"""


# The server DATABASE_URL names (PostgreSQL, as compose/bin/test's default); this run's own database beside it.
SERVER_URL = "postgres://postgres@127.0.0.1:5432/postgres"
DB_NAME = f"benchrender_{os.getpid()}"


def own_database(env: dict[str, str]) -> str:
    given = os.environ.get("DATABASE_URL", "")
    server = given if given.startswith(("postgres://", "postgresql://")) else SERVER_URL
    env["BENCH_SERVER_URL"] = server
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {DB_NAME}")
        connection.execute(f"CREATE DATABASE {DB_NAME}")
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(server)._replace(path=f"/{DB_NAME}"))


def drop_database(env: dict[str, str]) -> None:
    if "BENCH_SERVER_URL" not in env:
        return
    try:
        with psycopg.connect(env["BENCH_SERVER_URL"], autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    except psycopg.Error as error:
        print(f"bench render: could not drop the database {DB_NAME}: {error}", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--frames", type=int, default=24, help="frames of the job (default 24)")
    parser.add_argument("--width", type=int, default=320, help="the scene's width in pixels (default 320)")
    parser.add_argument("--height", type=int, default=240, help="the scene's height in pixels (default 240)")
    parser.add_argument("--samples", type=int, default=16, help="Cycles samples (default 16)")
    parser.add_argument("--chunk-size", type=int, default=24, help="the headline's frames per chunk (default 24)")
    parser.add_argument("--rounds", type=int, default=3, help="headline and baseline runs, interleaved (default 3)")
    parser.add_argument("--table", default="1,4,8", help="more chunk sizes, once each (default 1,4,8)")
    parser.add_argument("--two-slice-chunk", type=int, default=12, help="the 2-slice job's chunk size (default 12)")
    parser.add_argument("--two-slices", action=argparse.BooleanOptionalAction, default=True, help="the 2-slice job")


class Workers:
    """The two Celery workers a render job needs, each in a process group of its own; stopped together."""

    def __init__(self, env: dict[str, str], run_id: str) -> None:
        self.env, self.run_id = env, run_id
        self.processes: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []
        LOGS.mkdir(parents=True, exist_ok=True)

    def start(self, role: str, queue: str) -> None:
        # As compose/supervisor/supervisord.conf runs them: threads; the render one follows a slice per thread.
        name = f"bench-{role}-{self.run_id}@127.0.0.1"
        command = [str(BIN / "celery"), "--app", "portal", "worker", "--pool", "threads", "--concurrency", "4"]
        command += ["--queues", queue, "--hostname", name, "--without-gossip", "--without-mingle"]
        self.names.append(name)
        self._start(role, [*command, "--loglevel", "INFO"])

    def start_agent(self) -> None:
        """The GPU host's agent, which alone makes the slices' MIG instances (sessions/gpus/orders.py)."""
        self._start("agent", [str(BIN / "python"), "manage.py", "gpu_agent", "--no-docker", "--interval-ms", "1000"])

    def _start(self, role: str, command: list[str]) -> None:
        with (LOGS / f"bench-render-{role}.log").open("wb") as log:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop_process(process, group=True, timeout=20)


def docker(*args: str, timeout: float = 600) -> str:
    return run_checked([DOCKER, *args], f"docker {args[0]}", timeout=timeout).stdout


def make_scene(folder: Path, args: argparse.Namespace) -> Path:
    script = SCENE_SCRIPT.format(samples=args.samples, width=args.width, height=args.height, frames=args.frames)
    docker("run", "--rm", "--network", "none", "--user", "root", "-v", f"{folder}:/out", IMAGE, "blender", "-b",
           "--factory-startup", "--python-expr", script)  # fmt: skip
    return folder / "scene.blend"


def bare(scene: Path, out: Path, frames: int) -> dict[str, Any]:
    """The baseline: one `docker run` of bare Blender rendering every frame; its wall time and frames' file times."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    out.chmod(0o777)
    command = ["run", "--rm", "--network", "none", "--user", f"{os.geteuid()}:{os.getegid()}", "-e", "HOME=/tmp"]
    command += ["-v", f"{scene.parent}:/scene:ro", "-v", f"{out}:/out", IMAGE]
    command += ["blender", "-b", "/scene/scene.blend", "-o", "/out/frame_######", "-F", "PNG", "-a"]
    started = time.time()
    docker(*command)
    ended = time.time()
    mtimes = sorted(path.stat().st_mtime for path in out.glob("frame_*.png"))
    return {"wall_s": round(ended - started, 3), "frames": len(mtimes), "started": started, "frame_mtimes": mtimes}


def job(
    env: dict[str, str], workers: Workers, scene: Path, frames: int, chunk_size: int, slices: int
) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.render_job", str(scene), str(frames), str(chunk_size), str(slices)]
    output = run_checked([*command, *workers.names], "the job (bench.render_job)", cwd=ROOT, env=env, timeout=900)
    found: dict[str, Any] = json.loads(output.stdout.strip().splitlines()[-1])
    saved = [moment for moment in found["frame_saved_at"] if moment is not None]
    complete = found["state"] == "done" and found["frames_done"] == frames == found["frames_with_file"]
    found["complete"] = complete
    found["wall_s"] = round(max(saved) - found["queued_at"], 3) if complete else None
    found["chunk_size"], found["slices"] = chunk_size, slices
    return found


def median_gap(moments: list[float]) -> float | None:
    gaps = [later - earlier for earlier, later in itertools.pairwise(moments)]
    return round(statistics.median(gaps), 3) if gaps else None


def slope(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Least squares of time against the number of chunks: (seconds per chunk, seconds at no chunk)."""
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return round(b, 3), round(mean_y - b * mean_x, 3)


def summary(run: dict[str, Any], baseline_s: float) -> dict[str, Any]:
    chunks = run["chunks"]
    first_start = min((c["started_at"] for c in chunks if c["started_at"]), default=None)
    return {
        "chunk_size": run["chunk_size"],
        "slices": run["slices"],
        "chunks": len(chunks),
        "complete": run["complete"],
        "wall_s": run["wall_s"],
        "ratio": round(run["wall_s"] / baseline_s, 3) if run["wall_s"] else None,
        "queued_to_first_chunk_s": round(first_start - run["queued_at"], 3) if first_start else None,
        "queued_to_first_frame_s": round(run["frame_mtimes"][0] - run["queued_at"], 3) if run["frame_mtimes"] else None,
        "frame_gap_median_s": median_gap(run["frame_mtimes"]),
        "retried_chunks": sum(c["attempts"] > 1 for c in chunks),
        "failure": run["failure"] or None,
    }


def measure(args: argparse.Namespace, env: dict[str, str], tmp: Path, workers: Workers) -> dict[str, Any]:
    scene = make_scene(tmp / "scene", args)
    bare(scene, tmp / "bare", args.frames)  # warm: the image's layers and Blender's files in the page cache
    job(env, workers, scene, args.frames, args.chunk_size, 1)
    baselines, headline = [], []
    for _ in range(args.rounds):
        baselines.append(bare(scene, tmp / "bare", args.frames))
        headline.append(job(env, workers, scene, args.frames, args.chunk_size, 1))
    table = [job(env, workers, scene, args.frames, size, 1) for size in sorted({int(s) for s in args.table.split(",")})]
    two = [job(env, workers, scene, args.frames, args.two_slice_chunk, 2)] if args.two_slices else []
    baselines.append(bare(scene, tmp / "bare", args.frames))
    return {"baselines": baselines, "headline": headline, "table": table, "two": two}


def report(args: argparse.Namespace, runs: dict[str, Any]) -> Result:
    baselines: list[dict[str, Any]] = runs["baselines"]
    lost_bare = [b for b in baselines if b["frames"] != args.frames]
    baseline_s = round(statistics.median(b["wall_s"] for b in baselines), 3)
    every = runs["headline"] + runs["table"] + runs["two"]
    complete = all(run["complete"] for run in every) and not lost_bare
    headline = [run["wall_s"] for run in runs["headline"] if run["wall_s"] is not None]
    value = round(statistics.median(headline), 3) if headline else 0.0
    one_slice = [run for run in runs["headline"] + runs["table"] if run["complete"]]
    fit = slope([(len(run["chunks"]), run["wall_s"]) for run in one_slice])
    bare_gap = statistics.median(g for b in baselines if (g := median_gap(b["frame_mtimes"])) is not None)
    # Within one container: the headline's runs (one chunk by default; else its gaps hold chunk boundaries too).
    ours_gap = statistics.median(g for r in runs["headline"] if (g := median_gap(r["frame_mtimes"])) is not None)
    bare_first = statistics.median(b["frame_mtimes"][0] - b["started"] for b in baselines if b["frame_mtimes"])
    by_size: dict[int, list[float]] = {}
    for run in one_slice:
        by_size.setdefault(run["chunk_size"], []).append(run["wall_s"])
    details: dict[str, Any] = {
        "scene": f"{args.width}x{args.height}, {args.samples} samples, {args.frames} frames, Cycles on the CPU",
        "baseline_runs_s": [b["wall_s"] for b in baselines],
        "headline_runs_s": [run["wall_s"] for run in runs["headline"]],
        "headline_chunk_size": args.chunk_size,
        "all_frames_saved_no_job_failed": complete,
        "ratio_by_chunk_size": {
            size: {
                "median_s": round(statistics.median(times), 3),
                "ratio": round(statistics.median(times) / baseline_s, 3),
            }
            for size, times in sorted(by_size.items())
        },
        "per_chunk_overhead_s": fit[0] if fit else None,
        "fit_seconds_at_no_chunk": fit[1] if fit else None,
        "per_frame_s": {"bare": round(bare_gap, 3), "ours": round(ours_gap, 3)},
        "per_frame_overhead_s": round(ours_gap - bare_gap, 3),
        "start_to_first_frame_s": {"bare_docker_run": round(bare_first, 3)},
        "runs": [summary(run, baseline_s) for run in every],
    }
    if runs["two"]:
        two = runs["two"][0]
        one = min((statistics.median(times) for times in by_size.values()), default=None)
        details["two_slices"] = {
            **summary(two, baseline_s),
            "speed_up_over_best_one_slice": round(one / two["wall_s"], 3) if one and two["wall_s"] else None,
            "host_cpus": os.cpu_count(),
            "note": "each 1g slice's container gets min(2 CPUs per compute slice, the host's CPUs) and as many "
            "Cycles threads; on a 2-core host two slices share the same two cores",
        }
    print(json.dumps(details, indent=2))
    return Result(
        name="render",
        metric=f"queued_to_all_frames_saved_s_chunk_{args.chunk_size}",
        value=value,
        baseline_name="bare `blender -b` in the same image, one `docker run`, the same frames",
        baseline=baseline_s,
        better="lower",
        goal=f"ratio <= {GOAL_RATIO}, every frame saved, no job failed",
        goal_ratio=GOAL_RATIO if complete else -1.0,  # a lost frame or a failed job: never met
        unit="s",
        details=details,
    )


@contextlib.contextmanager
def render_portal(name: str) -> Iterator[tuple[dict[str, str], Workers, Path]]:
    """A portal of this run's own for render jobs: its database (migrated, the fleet synced), data folder,
    queues and container label, a default-queue and a render-queue Celery worker; all of it gone after,
    on failure too. Yields the environment its children run with, the workers and a scratch folder."""
    run_checked([str(ROOT / "compose/bin/build-render-image")], "compose/bin/build-render-image", timeout=1500)
    run_id = secrets.token_hex(4)
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir="/tmp"))
    tmp.chmod(0o755)
    queue = f"bench-{name}-{run_id}"
    env = dict(
        os.environ,
        PORTAL_DATA_DIR=str(tmp / "data"),
        PORTAL_RENDER_DIR=str(tmp / "render"),
        REDIS_URL=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"),
        PORTAL_CELERY_QUEUE=queue,
        PORTAL_RENDER_QUEUE=f"{queue}-render",
        PORTAL_ESTIMATE_QUEUE=f"{queue}-estimate",
        PORTAL_CACHE_PREFIX=queue,
        PORTAL_CHANNEL_PREFIX=queue,
        PORTAL_INSTANCE_ID=queue,  # the label on the portal's containers
        PORTAL_GPU_BACKEND="simulated",
        PORTAL_SIMULATED_FLEET=FLEET,
        PORTAL_BILLING_MIN_MINUTES="0",  # no credit check: the benchmark's person has no wallet
        PORTAL_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    workers = Workers(env, run_id)
    try:
        env["DATABASE_URL"] = own_database(env)
        (tmp / "data").mkdir()
        for step in (["migrate", "-v0"], ["sync_gpus"]):
            run_checked([str(BIN / "python"), "manage.py", *step], f"manage.py {step[0]}", cwd=ROOT, env=env)
        workers.start_agent()
        workers.start("worker", queue)
        workers.start("render", f"{queue}-render")
        workers.start("estimate", f"{queue}-estimate")
        yield env, workers, tmp
    finally:
        workers.stop()
        left = run_checked([DOCKER, "ps", "-aq", "--filter", f"label=gpu-portal.instance={queue}"], "docker ps")
        if left.stdout.split():
            run_checked([DOCKER, "rm", "-f", *left.stdout.split()], "docker rm")
        drop_database(env)
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace) -> Result:
    with render_portal("render") as (env, workers, tmp):
        runs = measure(args, env, tmp, workers)
    result = report(args, runs)
    result.write()
    return result


if __name__ == "__main__":
    raise BenchFailed("run it as: python -m bench render")
