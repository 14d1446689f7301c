"""Child process of the allocator benchmark: time allocate+release through the service layer.

Runs on its own database (DATABASE_URL) with a simulated fleet (PORTAL_SIMULATED_FLEET);
prints one JSON line with p50/p99 in milliseconds, for our rule and first-fit.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench.report import percentile  # noqa: E402
from sessions.gpus import placement  # noqa: E402
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate, release  # noqa: E402
from sessions.gpus.fleet import sync_fleet  # noqa: E402

PROFILES = ["1g.18gb"] * 8 + ["1g.35gb", "2g.35gb"] * 4 + ["3g.71gb"] * 2 + ["4g.71gb", "7g.141gb"]


def main(pairs: int, seed: int) -> None:
    call_command("migrate", verbosity=0)
    sync_fleet()
    # Other people hold the fill, a few slices each, as in a real fleet; the timed user holds none.
    tenants = [User.objects.create_user(f"tenant{n}") for n in range(500)]
    owner = User.objects.create_user("bench")
    rng = random.Random(seed)
    gpus = sync_fleet()[0].gpus.count()
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
    for name, rule in (("ours", placement.choose), ("first_fit", placement.first_fit)):
        times = []
        for _ in range(pairs):
            profile = rng.choice(PROFILES)
            started = time.perf_counter()
            try:
                with transaction.atomic():
                    taken = allocate(owner, SliceRequest("mig", profile), rule=rule)  # type: ignore[arg-type]
                with transaction.atomic():
                    release(taken.pk)
            except AllocationRefused:
                continue
            times.append((time.perf_counter() - started) * 1000)
        figures[name] = {"p50_ms": round(percentile(times, 50), 3), "p99_ms": round(percentile(times, 99), 3)}
    figures["fleet"] = {
        "gpus": gpus,
        "slices_held": len(fill) - len(fill) // 3,
        "database": connection.vendor,  # the goal is PostgreSQL's; SQLite is slower and says so
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
