"""Live GPU metrics under load: sample-to-browser delay over websockets against polling a JSON view.

Setup (BENCH.md, issue 5): the GPU agent on a simulated fleet of 8 H200 with 7
MIG devices each, sampling once a second; daphne; Redis; authenticated staff
clients in separate client processes, each subscribed to the fleet stream.
Headline: p99 delay from a sample being taken to its arrival at a client, at
500 clients. Baseline in the same run: the same clients polling
/sessions/fleet/live.json once a second; compared on daphne's CPU and on how
fresh the figures a client holds are, against dcgm-exporter's 30 s default.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.report import Result, percentile
from bench.server import BIN, LOGS, ROOT, BenchFailed, BenchPortal, stop_process

USERNAME, PASSWORD = "bench-operator", "bench passphrase 2026"
FLEET = "bench: 8xH200:mig"
DCGM_INTERVAL_S = 30.0
MIN_DELIVERED = 0.999
PREPARE_FLEET = """
from django.contrib.auth.models import User
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus import agency
from sessions.gpus.holders import Holder
from sessions.gpus.fleet import sync_fleet
from sessions.gpus.models import SliceQuota
agency.act_for(agency.hosts_of_this_machine())  # this script stands for the hosts' agent
sync_fleet()
for n in range(8):
    user = User.objects.create_user(f"tenant{n}")
    SliceQuota.objects.create(user=user, max_slices=7)
    for k in range(7):
        allocate(user, SliceRequest("mig", "1g.18gb"), holder=Holder.notebook(n * 7 + k + 1))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 100, 500], help="client counts (1 100 500)")
    parser.add_argument("--duration", type=float, default=20, help="seconds measured per phase (default 20)")
    parser.add_argument("--per-process", type=int, default=250, help="clients per client process (default 250)")
    parser.add_argument("--port", type=int, default=8766)


def clients(url: str, count: int, args: argparse.Namespace, cookie: str, poll: bool = False) -> list[dict[str, object]]:
    processes = math.ceil(count / args.per_process)
    shares = [count // processes + (1 if n < count % processes else 0) for n in range(processes)]
    command = [sys.executable, "-m", "bench.metrics_client", url, "--duration", str(args.duration), "--cookie", cookie]
    LOGS.mkdir(parents=True, exist_ok=True)
    running: list[tuple[subprocess.Popen[str], Path]] = []
    try:
        for number, share in enumerate(shares):
            log = LOGS / f"bench-metrics-client-{number}.log"  # its stderr, shown if it fails
            with log.open("w") as stderr:
                process = subprocess.Popen(
                    [*command, "--clients", str(share), *(["--poll"] if poll else [])],
                    cwd=ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            running.append((process, log))
        # One window for all processes: each says when its clients are all connected, then all start together.
        for process, log in running:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if line != "ready":
                stop_process(process, timeout=5)
                raise BenchFailed(f"a client process did not get ready: {line!r}\n{log.read_text()[-4000:]}")
        for process, _ in running:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        return [_last_line(process, log) for process, log in running]
    finally:
        for process, _ in running:  # one that failed leaves the others waiting for "go": none outlives the phase
            stop_process(process, timeout=5)


def _last_line(process: subprocess.Popen[str], log: Path) -> dict[str, object]:
    out = process.communicate(timeout=300)[0]
    if process.returncode != 0 or not out.strip():
        said = log.read_text()[-4000:]
        raise BenchFailed(f"a client process (bench.metrics_client) exited with {process.returncode}:\n{said}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def phase(portal: BenchPortal, url: str, count: int, args: argparse.Namespace, cookie: str, poll: bool) -> dict:  # type: ignore[type-arg]
    before, started = portal.cpu_seconds(), time.monotonic()
    outputs = clients(url, count, args, cookie, poll)
    cpu = portal.cpu_seconds() - before
    elapsed = time.monotonic() - started
    key = "ages" if poll else "delays"
    values = [v * 1000 for out in outputs for v in out[key]]  # type: ignore[attr-defined]
    kinds: Counter[str] = Counter()
    for out in outputs:
        kinds.update(out["failure_kinds"])  # type: ignore[call-overload]
    figures: dict[str, object] = {
        "clients": count,
        "messages" if not poll else "answers": len(values),
        "failures": sum(int(out["failures"]) for out in outputs),  # type: ignore[call-overload]
        "failure_kinds": dict(kinds),
        # daphne's CPU over the phase, connection set-up included, as a share of one core
        "daphne_cpu_share_of_core": round(cpu / elapsed, 3),
    }
    if not poll:
        figures.update(delivery(outputs, count))
        figures["seconds_to_connect_all"] = max(float(out["seconds_to_connect_all"]) for out in outputs)  # type: ignore[arg-type]
    if values:
        figures.update(
            p50_ms=round(percentile(values, 50), 1),
            p99_ms=round(percentile(values, 99), 1),
            mean_ms=round(sum(values) / len(values), 1),
        )
    if poll:
        times = [t * 1000 for out in outputs for t in out["request_times"]]  # type: ignore[attr-defined]
        figures["request_p99_ms"] = round(percentile(times, 99), 1) if times else None
    return figures


def delivery(outputs: list[dict[str, object]], count: int) -> dict[str, object]:
    """Frames that should have arrived against those that did: every client, for every frame sampled in the
    window (the union of what any client saw is what the agent published), failed clients included."""
    # Each client process has its own window (it starts once all its clients are connected).
    published = sorted({t for out in outputs for t in out["seen"]})  # type: ignore[attr-defined]
    received = sum(sum(out["counts"]) for out in outputs)  # type: ignore[call-overload]
    expected = sum(len(out["seen"]) * len(out["counts"]) for out in outputs)  # type: ignore[arg-type, misc]
    ticks = [b - a for a, b in itertools.pairwise(published)]
    slowest: dict[str, float] = {}
    for out in outputs:
        for t, late in out.get("frame_max", {}).items():  # type: ignore[attr-defined]
            slowest[t] = max(slowest.get(t, 0.0), late)
    return {
        "connected": sum(int(out["connected"]) for out in outputs),  # type: ignore[call-overload]
        "frames_published": len(published),
        "largest_gap_between_frames_s": round(max(ticks), 2) if ticks else None,
        "frames_expected": expected,
        "frames_received": received,
        "frames_missing": expected - received,
        "frames_twice": sum(int(out["duplicates"]) for out in outputs),  # type: ignore[call-overload]
        "slowest_arrival_per_frame_ms": [round(slowest[t] * 1000) for t in sorted(slowest, key=float)],
        "delivered_share": round(received / expected, 5) if expected else 0.0,
    }


def run(args: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp, BenchPortal(Path(tmp), args.port) as portal:
        portal.env.update(
            PORTAL_GPU_BACKEND="simulated",
            PORTAL_SIMULATED_FLEET=FLEET,
            PORTAL_METRICS_SOCKETS_PER_USER="5000",
        )
        portal.prepare(USERNAME, PASSWORD)
        portal.manage("shell", "-c", PREPARE_FLEET)
        portal.start()
        LOGS.mkdir(parents=True, exist_ok=True)
        with (LOGS / "bench-agent.log").open("wb") as agent_log:
            agent = subprocess.Popen(
                [str(BIN / "python"), "manage.py", "gpu_agent", "--no-docker"],
                cwd=ROOT,
                env=portal.env,
                stdout=agent_log,
                stderr=subprocess.STDOUT,
            )
        try:
            cookie = portal.login_cookie(USERNAME, PASSWORD)
            time.sleep(2)  # the agent's first frames
            socket_url = portal.base.replace("http://", "ws://") + "/ws/metrics/fleet/"
            pushed = {count: phase(portal, socket_url, count, args, cookie, poll=False) for count in args.clients}
            top = max(args.clients)
            polled = phase(portal, portal.base + "/sessions/fleet/live.json", top, args, cookie, poll=True)
        finally:
            stop_process(agent)
    headline = pushed[top]
    # Freshness: the mean age of the figures a client holds. Pushed once a second they are on average
    # half a tick plus the delivery delay old; dcgm-exporter collects every 30 s, so ~15 s at best.
    fresh_ms = 500 + float(headline.get("mean_ms", 0))  # type: ignore[arg-type]
    details = {
        "fleet": "8 x H200, 7 MIG devices each (56), 1 Hz",
        "websocket": {str(count): figures for count, figures in pushed.items()},
        "polling_json_once_a_second": polled,
        "cpu_ratio_websocket_over_polling": round(
            float(headline["daphne_cpu_share_of_core"]) / max(float(polled["daphne_cpu_share_of_core"]), 1e-9),  # type: ignore[arg-type]
            3,
        ),
        "freshness_ms_websocket": round(fresh_ms, 1),
        "freshness_ms_polling": polled.get("mean_ms"),
        "freshness_ratio_vs_dcgm_30s": round(fresh_ms / (DCGM_INTERVAL_S * 1000 / 2), 4),
    }
    print(json.dumps(details, indent=2))
    # A run whose clients failed or lost frames has not met its goal, whatever its p99.
    complete = all(
        int(figures["connected"]) == count and float(figures["delivered_share"]) >= MIN_DELIVERED  # type: ignore[call-overload, arg-type]
        for count, figures in pushed.items()
    )
    details["every_client_connected_and_delivered"] = complete
    result = Result(
        name="metrics",
        metric=f"p99_sample_to_client_ms_{top}_clients",
        value=float(headline.get("p99_ms", float("inf"))) if complete else float("inf"),  # type: ignore[arg-type]
        baseline_name=f"the same {top} clients polling /sessions/fleet/live.json once a second: p99 age of figures",
        baseline=float(polled.get("p99_ms", float("inf"))),  # type: ignore[arg-type]
        better="lower",
        goal=f"all clients connect, >= {MIN_DELIVERED:.1%} of frames arrive, p99 <= 150 ms (stretch 75 ms)",
        goal_ratio=1.0,
        unit="ms",
        details=details,
        goal_value=150.0,
    )
    result.write()
    return result
