"""Many GPU hosts (issue 32): the multi-host path's figures against the one-host path's, in the same run.

Part ``allocation``: the allocator's decision time (allocate+release of a MIG slice through the launch path's
allocator, p50 and p99, and eight processes at once) on 3 hosts of 64 simulated H200 each, against one host of
all 192, on PostgreSQL, the two interleaved over --rounds. On several hosts the allocator also chooses the host
(PORTAL_PLACEMENT, pack by default) by each host's slices, which come with the first look at the layouts (no
round trip of their own); a fleet of one host skips counting them. Headline: the p99 on three hosts over the p99
on one; goal ratio <= 1.25.

The issue's other figures (a launch to JupyterLab on a remote lab host against the single-host path, the
detection of a cut link, a 48-frame job on one host against two) need the lab (tests/lab) and are not measured
here yet.
"""

from __future__ import annotations

import argparse
import statistics

from bench.allocator import decision_time
from bench.report import Result

PER_HOST = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", type=int, default=3, help="hosts of the multi-host fleet (default 3)")
    parser.add_argument("--gpus-per-host", type=int, default=PER_HOST, help=f"H200 on each (default {PER_HOST})")
    parser.add_argument("--decisions", type=int, default=2000, help="allocate+release pairs timed (default 2000)")
    parser.add_argument("--processes", type=int, default=8, help="processes at once for throughput (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of each fleet (default 2)")
    parser.add_argument("--seed", type=int, default=2026)


def run(args: argparse.Namespace) -> Result:
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
