"""Child process of the allocator benchmark: time allocate+release as launches and stops call them.

Runs on its own database (DATABASE_URL) with a simulated fleet (PORTAL_SIMULATED_FLEET); each pair
runs inside a caller's ``transaction.atomic()``, as ``start_session`` and the session end run it, in a
process that is not the host's agent (as a web process): the GPU agent, a process of its own, makes and
destroys the MIG instances meanwhile (sessions/gpus/orders.py).
Prints one JSON line: p50/p99 in milliseconds for our rule and first-fit, one process at a time,
then PROCESSES processes allocating and releasing at once (throughput, p50/p99, refusals, and
whether the fleet's bookkeeping still matches its slices afterwards).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402
from django.db.models import Count  # noqa: E402

from bench.report import percentile  # noqa: E402
from sessions.gpus import agency, placement  # noqa: E402
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate, release  # noqa: E402
from sessions.gpus.fleet import sync_fleet  # noqa: E402
from sessions.gpus.models import Gpu, HostOrder, Slice  # noqa: E402
from sessions.gpus.orders import recount  # noqa: E402

PROFILES = ["1g.18gb"] * 8 + ["1g.35gb", "2g.35gb"] * 4 + ["3g.71gb"] * 2 + ["4g.71gb", "7g.141gb"]


def main(pairs: int, seed: int, processes: int) -> None:
    call_command("migrate", verbosity=0)
    with agency.acting_for(agency.hosts_of_this_machine()):  # discovery, as the host's agent
        sync_fleet()
    # This process allocates as a web process does: it records each slice and the order for its MIG instance;
    # the host's agent, a process of its own as under make run, carries the orders out meanwhile.
    agent = subprocess.Popen(
        [sys.executable, "manage.py", "gpu_agent", "--no-docker", "--interval-ms", "60000"],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _measure(pairs, seed, processes)
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def _measure(pairs: int, seed: int, processes: int) -> None:
    # Other people hold the fill, a few slices each, as in a real fleet; the timed user holds none.
    tenants = [User.objects.create_user(f"tenant{n}") for n in range(500)]
    owner = User.objects.create_user("bench")
    rng = random.Random(seed)
    gpus = Gpu.objects.count()
    fill = []
    for number in range(2 * gpus):  # about half the fleet's compute, then some churn holes
        try:
            fill.append(allocate(tenants[number % len(tenants)], SliceRequest("mig", rng.choice(PROFILES))))
        except AllocationRefused:
            continue
    for taken in rng.sample(fill, len(fill) // 3):
        release(taken.pk)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")  # what autovacuum does for a fleet that has run a while
    figures: dict[str, dict[str, object]] = {}
    # As launches and stops call the allocator: each inside its caller's transaction (start_session's and the
    # session end's atomic blocks), which is the path people's requests take.
    for name, rule in (("ours", None), ("first_fit", placement.first_fit)):  # ours: as the portal runs it
        times = []
        for _ in range(pairs):
            profile = rng.choice(PROFILES)
            started = time.perf_counter()
            try:
                with transaction.atomic():
                    taken = allocate(owner, SliceRequest("mig", profile), rule=rule)
                with transaction.atomic():
                    release(taken.pk)
            except AllocationRefused:
                continue
            times.append((time.perf_counter() - started) * 1000)
        figures[name] = {"p50_ms": round(percentile(times, 50), 3), "p99_ms": round(percentile(times, 99), 3)}
    if processes:  # 0: one process only (interleaved before/after comparisons)
        figures["concurrent"] = concurrent(processes, pairs // processes, seed)
    figures["fleet"] = {
        "gpus": gpus,
        "slices_held": len(fill) - len(fill) // 3,
        "database": connection.vendor,  # the goal is PostgreSQL's; SQLite is slower and says so
    }
    print(json.dumps(figures))


def pair(owner: User, profile: str) -> bool:
    """One allocate and one release, each inside its caller's transaction; False if refused."""
    try:
        with transaction.atomic():
            taken = allocate(owner, SliceRequest("mig", profile))
    except AllocationRefused:
        return False
    with transaction.atomic():
        release(taken.pk)
    return True


def concurrent(processes: int, pairs: int, seed: int) -> dict[str, Any]:
    """PROCESSES processes, each its own person and connection, allocating and releasing at once.

    The fleet keeps room for every request throughout (half of it is free), so any refusal is a
    spurious one; afterwards every GPU's bookkeeping must match its instances and active slices.
    """
    owners = [User.objects.create_user(f"racer{n}").pk for n in range(processes)]
    held_before = Slice.objects.filter(released_at__isnull=True).count()
    context = multiprocessing.get_context("spawn")  # each child its own Django and connection (pool)
    start, results = context.Barrier(processes + 1), context.Queue()
    children = [
        context.Process(target=_race, args=(owner, pairs, seed + n, start, results)) for n, owner in enumerate(owners)
    ]
    for child in children:
        child.start()
    try:
        start.wait(timeout=300)
    except threading.BrokenBarrierError:
        raise RuntimeError("a racing process failed:\n" + results.get(timeout=10)["error"]) from None
    began = time.perf_counter()
    answers = [results.get(timeout=600) for _ in children]
    wall = time.perf_counter() - began
    for child in children:
        child.join()
    failed = [answer["error"] for answer in answers if "error" in answer]
    if failed:
        raise RuntimeError("a racing process failed:\n" + failed[0])
    times = [ms for answer in answers for ms in answer["times"]]
    refused = sum(answer["refused"] for answer in answers)
    return {
        "processes": processes,
        "pairs": len(times) + refused,
        "pairs_per_s": round((len(times) + refused) / wall, 1),
        "p50_ms": round(percentile(times, 50), 3),
        "p99_ms": round(percentile(times, 99), 3),
        "refused": refused,
        "slices_left_held": Slice.objects.filter(released_at__isnull=True).count() - held_before,
        "bookkeeping_matches": bookkeeping_matches(),
    }


def _race(owner_id: int, pairs: int, seed: int, start: Any, results: Any) -> None:
    try:
        owner = User.objects.get(pk=owner_id)
        rng = random.Random(seed)
        start.wait()
        times, refused = [], 0
        for _ in range(pairs):
            began = time.perf_counter()
            if pair(owner, rng.choice(PROFILES)):
                times.append((time.perf_counter() - began) * 1000)
            else:
                refused += 1
        results.put({"times": times, "refused": refused})
    except BaseException:  # the parent reports it; a child that dies silently would leave it waiting
        results.put({"error": traceback.format_exc()})
        start.abort()  # the parent stops waiting at the start line
        raise
    finally:
        connections.close_all()


def bookkeeping_matches() -> bool:
    """Every GPU's layout and count as recomputed from its instances and slices, and no instance held twice, once
    the agent has carried out every order."""
    give_up = time.monotonic() + 120
    while HostOrder.objects.filter(state=HostOrder.State.PENDING).exists() and time.monotonic() < give_up:
        time.sleep(0.2)
    for gpu in Gpu.objects.all():
        recorded = (gpu.layout(), gpu.active_slices)
        recount(gpu)
        if (gpu.layout(), gpu.active_slices) != recorded:
            return False
    doubled = Slice.objects.filter(released_at__isnull=True, instance__isnull=False).values("instance")
    return not doubled.annotate(n=Count("id")).filter(n__gt=1).exists()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 8)
