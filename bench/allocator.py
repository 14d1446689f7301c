"""The allocator's placement rule against first-fit and against the offline optimum.

Three figures (BENCH.md): packing against the exhaustive optimum on small
fleets (the headline), blocking under churn on 64 simulated H200, and the
decision time of allocate+release through the service layer and PostgreSQL
with 1,000 simulated GPUs (run in a child process on its own database).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

from bench.report import Result  # noqa: E402
from bench.server import ROOT, bench_database_url  # noqa: E402
from sessions.gpus import catalog, placement  # noqa: E402
from sessions.gpus.catalog import GpuModel, Profile  # noqa: E402
from sessions.gpus.placement import Layout  # noqa: E402

Rule = Callable[[GpuModel, Sequence[tuple[int, Layout]], Profile], tuple[int, int] | None]
RULES: dict[str, Rule] = {"ours": placement.choose, "first_fit": placement.first_fit}
H200 = catalog.model("H200-SXM5-141GB")
A100_40 = catalog.model("A100-SXM4-40GB")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sequences", type=int, default=200, help="sequences per fleet (default 200)")
    parser.add_argument("--length", type=int, default=12, help="requests per sequence (default 12)")
    parser.add_argument("--churn-requests", type=int, default=20000, help="arrivals per churn run (default 20000)")
    parser.add_argument("--gpus", type=int, default=1000, help="fleet size for decision time (default 1000)")
    parser.add_argument("--decisions", type=int, default=2000, help="allocate+release pairs timed (default 2000)")
    parser.add_argument("--seed", type=int, default=2026)


# Request mixes: weight per profile. "small-heavy" halves with each step up in size.
def small_heavy(profile: Profile) -> float:
    base = {1: 8.0, 2: 4.0, 3: 2.0, 4: 1.0, 7: 1.0}[profile.compute_slices]
    return base / 4 if profile.media_extensions else base


def balanced(profile: Profile) -> float:
    return 0.25 if profile.media_extensions else 1.0


def large_heavy(profile: Profile) -> float:
    return 0.0 if profile.media_extensions else float(profile.compute_slices)


MIXES = {"small-heavy": small_heavy, "balanced": balanced, "large-heavy": large_heavy}


def draw(model: GpuModel, weigh: Callable[[Profile], float], rng: random.Random, count: int) -> list[Profile]:
    profiles = [p for p in model.profiles if weigh(p) > 0]
    return rng.choices(profiles, [weigh(p) for p in profiles], k=count)


def served(model: GpuModel, gpus: int, sequence: list[Profile], rule: Rule) -> int:
    layouts = [Layout()] * gpus
    for number, profile in enumerate(sequence):
        choice = rule(model, list(enumerate(layouts)), profile)
        if choice is None:
            return number
        index, start = choice
        layouts = [*layouts[:index], layouts[index].with_instance(profile, start), *layouts[index + 1 :]]
    return len(sequence)


def optimum(model: GpuModel, gpus: int, sequence: list[Profile]) -> int:
    """The longest prefix of the sequence that some placement of all of it can hold (exhaustive search)."""

    @cache
    def longest(done: int, layouts: tuple[Layout, ...]) -> int:
        if done == len(sequence):
            return done
        best = done
        tried: set[tuple[Layout, ...]] = set()
        for index, layout in enumerate(layouts):
            for start in placement.free_starts(model, layout, sequence[done]):
                after = list(layouts)
                after[index] = layout.with_instance(sequence[done], start)
                key = tuple(sorted(after, key=lambda item: (item.memory_mask, item.compute_used, item.counts)))
                if key not in tried:
                    tried.add(key)
                    best = max(best, longest(done + 1, key))
                    if best == len(sequence):
                        return best
        return best

    return longest(0, tuple([Layout()] * gpus))


def packing(args: argparse.Namespace, weigh: Callable[[Profile], float]) -> dict[str, object]:
    rng = random.Random(args.seed)
    totals = {"ours": 0, "first_fit": 0, "optimum": 0}
    fleets = {}
    for model, gpus in ((H200, 1), (H200, 2), (A100_40, 1)):
        part = {"ours": 0, "first_fit": 0, "optimum": 0}
        for _ in range(args.sequences):
            sequence = draw(model, weigh, rng, args.length)
            part["optimum"] += optimum(model, gpus, sequence)
            for name, rule in RULES.items():
                part[name] += served(model, gpus, sequence, rule)
        fleets[f"{gpus}x{model.name}"] = {k: round(part[k] / part["optimum"], 4) for k in ("ours", "first_fit")}
        for key in totals:
            totals[key] += part[key]
    return {
        "ours_vs_optimum": round(totals["ours"] / totals["optimum"], 4),
        "first_fit_vs_optimum": round(totals["first_fit"] / totals["optimum"], 4),
        "requests_served": totals,
        "per_fleet": fleets,
    }


def churn(args: argparse.Namespace, weigh: Callable[[Profile], float], rule: Rule, seed: int) -> float:
    """Share of requested compute-slice-time rejected, 64 H200 at offered load 0.9."""
    rng = random.Random(seed)
    profiles = [p for p in H200.profiles if weigh(p) > 0]
    weights = [weigh(p) for p in profiles]
    mean_compute = sum(p.compute_slices * w for p, w in zip(profiles, weights, strict=True)) / sum(weights)
    gpus = 64
    rate = 0.9 * gpus * H200.compute_slices / mean_compute  # mean holding time is 1
    layouts = [Layout()] * gpus
    departures: list[tuple[float, int, int, int, str]] = []
    now, asked, refused = 0.0, 0.0, 0.0
    warm_up = args.churn_requests // 10
    for number in range(args.churn_requests):
        now += rng.expovariate(rate)
        profile, hold = rng.choices(profiles, weights)[0], rng.expovariate(1.0)
        while departures and departures[0][0] <= now:
            _, _, index, start, name = heapq.heappop(departures)
            layouts[index] = layouts[index].without_instance(H200.profile(name), start)
        choice = rule(H200, list(enumerate(layouts)), profile)
        if number >= warm_up:
            asked += profile.compute_slices * hold
        if choice is None:
            refused += profile.compute_slices * hold if number >= warm_up else 0.0
            continue
        index, start = choice
        layouts[index] = layouts[index].with_instance(profile, start)
        heapq.heappush(departures, (now + hold, number, index, start, profile.name))
    return refused / asked


def decision_time(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-allocator-") as tmp:
        env = dict(os.environ)
        env.update(
            PORTAL_DATA_DIR=tmp,
            DATABASE_URL=bench_database_url(Path(tmp)),
            PORTAL_GPU_BACKEND="simulated",
            PORTAL_SIMULATED_FLEET=f"bench: {args.gpus}xH200:mig",
            PORTAL_LOG_LEVEL="WARNING",
        )
        command = [sys.executable, "-m", "bench.allocator_db", str(args.decisions), str(args.seed)]
        output = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if output.returncode:
        raise RuntimeError(f"the decision-time child failed:\n{output.stderr[-3000:]}")
    figures = dict(json.loads(output.stdout.strip().splitlines()[-1]))
    if figures["fleet"]["database"] != "postgresql":
        print("decision time measured on SQLite: set DATABASE_URL to PostgreSQL for the goal's figure", file=sys.stderr)
    return figures


def run(args: argparse.Namespace) -> Result:
    headline = packing(args, small_heavy)
    uniform = packing(args, balanced)
    blocking = {}
    for name, weigh in MIXES.items():
        ours, first = (churn(args, weigh, rule, args.seed) for rule in (placement.choose, placement.first_fit))
        blocking[name] = {"ours": round(ours, 4), "first_fit": round(first, 4), "ratio": round(ours / first, 3)}
    timing = decision_time(args)
    details = {
        "packing_small_heavy": headline,
        "packing_balanced_mix": uniform,
        "churn_blocking_64_h200_load_0_9": blocking,
        "churn_never_worse_than_first_fit": all(b["ours"] <= b["first_fit"] for b in blocking.values()),
        "decision_time": timing,
    }
    print(json.dumps(details, indent=2))
    result = Result(
        name="allocator",
        metric="packing_ours_over_optimum",
        value=float(headline["ours_vs_optimum"]),  # type: ignore[arg-type]
        baseline_name="exhaustive offline optimum (first-fit reaches details.packing_small_heavy.first_fit_vs_optimum)",
        baseline=1.0,
        better="higher",
        goal="ratio >= 0.97",
        goal_ratio=0.97,
        unit="share of optimum",
        details=details,
    )
    result.write()
    return result
