"""The dashboard page under load: p99 latency of a logged-in dashboard against Django's
bare view (/healthz) on the same daphne process, in the same run."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.report import Result, summary_ms
from bench.server import ROOT, BenchPortal, run_checked

USERNAME, PASSWORD = "bench-operator", "bench passphrase 2026"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--duration", type=float, default=20, help="seconds per measured phase (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating baseline/dashboard rounds (default 2)")
    parser.add_argument("--port", type=int, default=8765)


def load(url: str, clients: int, duration: float, cookie: str) -> dict[str, object]:
    command = [sys.executable, "-m", "bench.loadgen", url, "--clients", str(clients), "--duration", str(duration)]
    output = run_checked([*command, "--cookie", cookie], "the load generator (bench.loadgen)", cwd=ROOT)
    return dict(json.loads(output.stdout))


def measure(portal: BenchPortal, path: str, args: argparse.Namespace, cookie: str) -> tuple[list[float], int, float]:
    before = portal.cpu_seconds()
    outcome = load(portal.base + path, args.clients, args.duration / args.rounds, cookie)
    latencies = list(outcome["latencies"])  # type: ignore[call-overload]
    return latencies, int(outcome["errors"]), portal.cpu_seconds() - before  # type: ignore[call-overload]


def run(args: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp, BenchPortal(Path(tmp), args.port) as portal:
        portal.prepare(USERNAME, PASSWORD)
        portal.start()
        cookie = portal.login_cookie(USERNAME, PASSWORD)
        load(portal.base + "/", args.clients, 2, cookie)  # warm caches and connections
        phases: dict[str, dict[str, object]] = {"/healthz": {}, "/": {}}
        collected: dict[str, tuple[list[float], int, float]] = {path: ([], 0, 0.0) for path in phases}
        for _ in range(args.rounds):
            for path in phases:
                latencies, errors, cpu = measure(portal, path, args, cookie)
                old = collected[path]
                collected[path] = (old[0] + latencies, old[1] + errors, old[2] + cpu)
    for path, (latencies, errors, cpu) in collected.items():
        phases[path] = {
            **summary_ms(latencies),
            "errors": errors,
            "server_cpu_ms_per_request": round(cpu * 1000 / max(1, len(latencies)), 3),
        }
    dashboard, hello = phases["/"], phases["/healthz"]
    result = Result(
        name="dashboard",
        metric="p99_latency_ms",
        value=float(dashboard["p99_ms"]),  # type: ignore[arg-type]
        baseline_name="Django's bare view (/healthz), same daphne, same clients",
        baseline=float(hello["p99_ms"]),  # type: ignore[arg-type]
        better="lower",
        goal="ratio <= 3.0",
        goal_ratio=3.0,
        unit="ms",
        details={"clients": args.clients, "seconds_per_path": args.duration, "dashboard": dashboard, "hello": hello},
    )
    print(json.dumps(result.details, indent=2))
    result.write()
    return result
