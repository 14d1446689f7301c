"""Many GPU hosts (issue 32): the multi-host path's figures against the one-host path's, in the same run.

Part ``allocation``: the allocator's decision time (allocate+release of a MIG slice through the launch path's
allocator, p50 and p99, and eight processes at once) on 3 hosts of 64 simulated H200 each, against one host of
all 192, on PostgreSQL, the two interleaved over --rounds. On several hosts the allocator also chooses the host
(PORTAL_PLACEMENT, pack by default) by each host's slices, which come with the first look at the layouts (no
round trip of their own); a fleet of one host skips counting them. Headline: the p99 on three hosts over the p99
on one; goal ratio <= 1.25.

Part ``lab`` (``--part lab``, about 9 min, as root: it builds the lab): the lab's figures, measured by
``tests/lab/bench_lab.py`` through the lab tests' own fixtures (run here with pytest, which writes them to a
file this reads): a session's launch to its JupyterLab answering through the public address on a remote lab
host (the lab's hub, a Swarm service on the second host) against the single-host path (this machine's hub
and engine), interleaved, headline the median over the single-host median, goal ratio <= 1.3; and a 48-frame
job (chunks of 4) on one host's slice against two hosts' at once, reported as the two hosts' time over the
one host's (below 1 is a speed-up). The detection of a cut link is the lab test's own figure
(``tests/lab/test_lab_notebooks.py`` writes it to artifacts/lab-detection.txt and holds it to 30 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.allocator import decision_time
from bench.report import Result
from bench.server import ROOT, BenchFailed

PER_HOST = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", type=int, default=3, help="hosts of the multi-host fleet (default 3)")
    parser.add_argument("--gpus-per-host", type=int, default=PER_HOST, help=f"H200 on each (default {PER_HOST})")
    parser.add_argument("--decisions", type=int, default=2000, help="allocate+release pairs timed (default 2000)")
    parser.add_argument("--processes", type=int, default=8, help="processes at once for throughput (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of each fleet (default 2)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--part", choices=("allocation", "lab"), default="allocation", help="what to measure")
    parser.add_argument("--lab-runs", type=int, default=3, help="launches of each kind in the lab part (default 3)")


def run(args: argparse.Namespace) -> Result:
    return lab(args) if args.part == "lab" else allocation(args)


def allocation(args: argparse.Namespace) -> Result:
    total = args.hosts * args.gpus_per_host
    one_host = f"bench: {total}xH200:mig"
    many_hosts = "; ".join(f"bench{n}: {args.gpus_per_host}xH200:mig" for n in range(1, args.hosts + 1))
    timed = argparse.Namespace(decisions=args.decisions, seed=args.seed, processes=args.processes, gpus=total)
    one, many = [], []
    for _ in range(args.rounds):
        one.append(decision_time(timed, one_host))
        many.append(decision_time(timed, many_hosts))
    if any(run["fleet"]["database"] != "postgresql" for run in one + many):  # type: ignore[index]
        raise SystemExit("the allocation figures are PostgreSQL's: set DATABASE_URL to a PostgreSQL database")

    def median(runs: list[dict[str, object]], part: str, figure: str) -> float:
        return round(statistics.median(float(run[part][figure]) for run in runs), 3)  # type: ignore[index]

    details: dict[str, object] = {
        f"{label}_{part}_{figure}": median(runs, part, figure)
        for label, runs in (("one_host", one), ("hosts", many))
        for part, figure in (("ours", "p50_ms"), ("ours", "p99_ms"), ("concurrent", "pairs_per_s"))
    }
    details.update(fleets={"one_host": one_host, "hosts": many_hosts}, runs={"one_host": one, "hosts": many})
    result = Result(
        name="multihost",
        metric=f"allocation p99 (allocate+release), {args.hosts} hosts x {args.gpus_per_host} simulated H200",
        value=details["hosts_ours_p99_ms"],  # type: ignore[arg-type]
        baseline_name=f"one host of {total} simulated H200, same run, interleaved",
        baseline=details["one_host_ours_p99_ms"],  # type: ignore[arg-type]
        better="lower",
        goal="ratio <= 1.25",
        goal_ratio=1.25,
        unit="ms",
        details=details,
    )
    for key in ("one_host_ours_p50_ms", "hosts_ours_p50_ms", "one_host_ours_p99_ms", "hosts_ours_p99_ms",
                "one_host_concurrent_pairs_per_s", "hosts_concurrent_pairs_per_s"):  # fmt: skip
        print(f"{key:<36}{details[key]}")
    result.write()
    return result


def lab(args: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory() as folder:
        figures = Path(folder) / "lab.json"
        env = {**os.environ, "PORTAL_BENCH_LAB_OUT": str(figures), "PORTAL_BENCH_LAB_RUNS": str(args.lab_runs)}
        command = [sys.executable, "-m", "pytest", "tests/lab/bench_lab.py", "-q", "-p", "no:logging", "--timeout=1500"]
        done = subprocess.run(command, cwd=ROOT, env=env, check=False)
        if done.returncode or not figures.exists():
            raise BenchFailed(f"the lab's measurements failed (pytest exit {done.returncode}): see its output above")
        found = json.loads(figures.read_text())
    launch, render = found["launch"], found["render"]
    medians = {f"{part}_{key}": round(statistics.median(values), 3) for part, runs in found.items()
               for key, values in runs.items()}  # fmt: skip
    details: dict[str, object] = {**medians, "runs": found}
    speed_up = round(medians["render_one_host_s"] / medians["render_two_hosts_s"], 3)
    details["render_speed_up"] = speed_up
    for key, value in sorted(details.items()):
        if key != "runs":
            print(f"{key:<36}{value}")
    Result(
        name="multihost",
        metric="a 48-frame job (chunks of 4) on two lab hosts at once",
        value=medians["render_two_hosts_s"],
        baseline_name="the same job on one lab host's slice, same run, interleaved",
        baseline=medians["render_one_host_s"],
        better="lower",
        goal="reported (speed-up = 1/ratio); 2 cores shared by both hosts",
        goal_ratio=1.0,
        unit="s",
        details={"runs": render, "speed_up": speed_up},
    ).write()
    result = Result(
        name="multihost",
        metric="launch to JupyterLab on a remote lab host (Swarm service), median",
        value=medians["launch_lab_host_s"],
        baseline_name="the same launch on the single-host path, same run, interleaved",
        baseline=medians["launch_single_host_s"],
        better="lower",
        goal="ratio <= 1.3",
        goal_ratio=1.3,
        unit="s",
        details={"runs": launch},
    )
    result.write()
    return result
