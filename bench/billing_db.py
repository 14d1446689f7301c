"""Child process of the billing benchmark: the meter's tick on its own PostgreSQL database (DATABASE_URL).

Builds a simulated fleet, 1,000 people, and slices held on it (inserted set-based: as many running as
the size asks, and as many more that ran and ended earlier, so the tick has history to ignore); opens
their usages with one tick, then times ticks a minute apart. Time passes the way tests/billing move
it: every recorded moment of the running holdings lies a minute further back; then what autovacuum
would have tidied is vacuumed, and for the "after a checkpoint" figures a CHECKPOINT runs right
before the tick. The naive per-usage ORM loop charges one such minute at the smallest size, in the
same run. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

from sessions.gpus import agency  # noqa: E402

# The benchmark stands for the simulated hosts' agent: its launches make their MIG instances at once, as before.
agency.act_for(agency.hosts_of_this_machine())

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models.functions import Now  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from billing import meter, rollup, seeds  # noqa: E402
from billing.models import Account, ChargedMinute, Entry, LedgerTransaction, Market, Price, Usage, UsageDay  # noqa: E402
from portal.clock import database_now  # noqa: E402
from sessions.gpus.fleet import sync_fleet  # noqa: E402
from sessions.gpus.models import Gpu, Slice  # noqa: E402

PEOPLE = 1000
MINUTES_PER_DAY = 1440
SLICE = Slice._meta.db_table
# Running holdings began up to BACKLOG minutes ago; ended ones lasted up to LASTED minutes, a day back.
BACKLOG, LASTED = 30, 30
HOLD = f"""
INSERT INTO {SLICE} (gpu_id, instance_id, kind, profile, placement_start, placement_size, compute_slices,
                     memory_gib, device_uuid, owner_id, holder_kind, holder_id, held_from, held_until,
                     seen_at, allocated_at, released_at, release_reason, metered, shares)
SELECT g.id, NULL, g.kind, g.profile, NULL, NULL, 1, 18, 'bench-' || n, p.ids[1 + n %% {PEOPLE}],
       'notebook', n, s.held_from, s.held_until, CASE WHEN %(ended)s THEN s.held_until ELSE now() END,
       s.held_from, s.held_until, CASE WHEN %(ended)s THEN 'ended' ELSE '' END, false, g.shares
FROM generate_series(%(first)s, %(last)s) AS n
CROSS JOIN (SELECT array_agg(id ORDER BY id) AS ids FROM auth_user WHERE username LIKE 'tenant%%') p
CROSS JOIN LATERAL (
    SELECT gpu.id, CASE gpu.sharing WHEN 'mig' THEN 'mig' ELSE 'shared' END AS kind, gpu.share_limit AS shares,
           CASE gpu.sharing WHEN 'mig' THEN (ARRAY['1g.18gb', '2g.35gb', '3g.71gb'])[1 + n %% 3] ELSE '' END AS profile
    FROM {Gpu._meta.db_table} gpu WHERE gpu.id = (%(gpus)s::bigint[])[1 + n %% %(gpu_count)s]
) g
CROSS JOIN LATERAL (
    SELECT CASE WHEN %(ended)s THEN now() - interval '1 day' - (n %% 997) * interval '1 second'
                ELSE %(phase)s - (n %% {BACKLOG}) * interval '1 minute' END AS held_from
) s0
CROSS JOIN LATERAL (
    SELECT s0.held_from, CASE WHEN %(ended)s THEN s0.held_from + (1 + n %% {LASTED}) * interval '1 minute' END
           AS held_until
) s
"""


def main(sizes: list[int], runs: int, baseline_size: int) -> None:
    call_command("migrate", verbosity=0)
    seeds.ensure(Price)
    sync_fleet()
    User.objects.bulk_create(User(username=f"tenant{n}") for n in range(PEOPLE))
    gpus = list(Gpu.objects.exclude(sharing=Gpu.Sharing.WHOLE).values_list("pk", flat=True))  # one whole slice each
    figures: dict[str, Any] = {"sizes": {}, "people": PEOPLE}
    held = 0
    for size in sizes:
        began = time.perf_counter()
        hold(held, size - held, gpus, ended=False)
        hold(10_000_000 + held, size - held, gpus, ended=True)  # history: holdings that ran and ended a day ago
        held = size
        vacuum()
        setup_s = time.perf_counter() - began
        opening = timed(meter.tick)
        vacuum()
        # The opening wrote millions of rows; let them reach disk now, and tick once, so the steady ticks
        # below are steady (no checkpoint of the opening's writes under way) and the opening's backlog is gone.
        checkpoint()
        minute_passes()
        warm_up = tick(size, set())
        row: dict[str, Any] = {
            "setup_s": round(setup_s, 1),
            "opening_tick_s": opening[0],
            "opening_minutes": opening[1].minutes,
            "warm_up_tick_s": warm_up,
        }
        if size == baseline_size:
            row["naive"] = naive(size)
        steady, after = [], []
        queries: set[int] = set()
        for _ in range(runs):
            minute_passes()
            steady.append(tick(size, queries))
        for _ in range(runs):
            minute_passes()
            checkpoint()
            after.append(tick(size, queries))
        row.update(steady_s=steady, after_checkpoint_s=after, queries_per_tick=sorted(queries))
        row["steady_median_s"] = statistics.median(steady)
        figures["sizes"][str(size)] = row
        print(f"bench billing: {size} usages: {row}", file=sys.stderr, flush=True)
    figures["storage"] = storage(sizes[-1])
    figures["ledger_balanced"] = Entry.objects.aggregate(total=django.db.models.Sum("amount"))["total"] == 0
    print(json.dumps(figures))


def hold(first: int, count: int, gpus: list[int], ended: bool) -> None:
    """Holdings numbered from ``first``; running ones all began at the same second of a minute (the phase),
    whole minutes apart, so a tick placed mid-minute charges exactly one minute each (minute_passes)."""
    if count <= 0:
        return
    phase = Usage.objects.filter(open=True).order_by("id").values_list("started", flat=True).first()
    values: dict[str, Any] = {
        "first": first,
        "last": first + count - 1,
        "gpus": gpus,
        "gpu_count": len(gpus),
        "ended": ended,
    }
    with connection.cursor() as cursor:
        cursor.execute(HOLD, {**values, "phase": phase or database_now() - timedelta(seconds=30)})


def vacuum() -> None:
    """What autovacuum does between ticks on a busy table: dead versions gone, statistics fresh."""
    with connection.cursor() as cursor:
        for model in (Usage, Slice, ChargedMinute, LedgerTransaction, Entry):
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")


def checkpoint() -> None:
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")


def minute_passes() -> None:
    """A minute passes since the last tick, as the meter sees it: the running holdings' recorded moments move
    back until the next tick falls half-way through their next minute (however long the bench itself took
    since the last tick, which the database's clock counts too)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXTRACT(EPOCH FROM now() - started), billed_minutes FROM {Usage._meta.db_table} "
            "WHERE open ORDER BY id LIMIT 1"
        )
        elapsed, billed = cursor.fetchone()
    step = timedelta(seconds=billed * 60 + 30 - float(elapsed))
    with transaction.atomic():
        # The containers ran all along: reconciliation's look (every 20 s) is their proof of life.
        Slice.objects.filter(held_from__isnull=False, held_until__isnull=True).update(
            held_from=django.db.models.F("held_from") - step, seen_at=Now()
        )
        Usage.objects.filter(open=True).update(started=django.db.models.F("started") - step)
    vacuum()


def timed(work: Callable[[], meter.Outcome]) -> tuple[float, meter.Outcome]:
    began = time.perf_counter()
    outcome = work()
    return round(time.perf_counter() - began, 3), outcome


def tick(size: int, queries: set[int]) -> float:
    with CaptureQueriesContext(connection) as captured:
        took, outcome = timed(meter.tick)
    if outcome.minutes != size or outcome.skipped:
        raise RuntimeError(f"a tick a minute later charged {outcome.minutes} minutes for {size} running usages")
    queries.add(len(captured.captured_queries))
    return took


def naive(size: int) -> dict[str, float]:
    """The baseline: one usage at a time through the ORM, a charge row and two ledger entries each."""
    minute_passes()
    now = database_now()
    revenue = {
        Market.ON_DEMAND: Account.objects.get(kind=Account.Kind.REVENUE_ON_DEMAND),
        Market.SPOT: Account.objects.get(kind=Account.Kind.REVENUE_SPOT),
    }
    began = time.perf_counter()
    charged = 0
    for usage in Usage.objects.filter(open=True).order_by("id"):
        with transaction.atomic():
            upto = meter.minutes_due(usage.started, usage.ended, now, now)  # seen running now (minute_passes)
            if upto <= usage.billed_minutes:
                continue
            posted = LedgerTransaction.objects.create(kind="usage", user_id=usage.owner_id, memo="per-minute charges")
            for minute in range(usage.billed_minutes, upto):
                ChargedMinute.objects.create(usage=usage, minute=minute, transaction=posted)
            amount = usage.per_minute * (upto - usage.billed_minutes)
            wallet = Account.objects.get(kind=Account.Kind.WALLET, user_id=usage.owner_id)
            Entry.objects.create(transaction=posted, account=wallet, amount=-amount)
            Entry.objects.create(transaction=posted, account=revenue[Market(usage.market)], amount=amount)
            usage.billed_minutes = upto
            usage.save(update_fields=["billed_minutes"])
            charged += 1
    took = time.perf_counter() - began
    if charged != size:
        raise RuntimeError(f"the naive loop charged {charged} usages of {size}")
    return {"s": round(took, 3), "usages": size, "ms_per_usage": round(took / size * 1000, 4)}


def storage(size: int) -> dict[str, Any]:
    """Bytes per minute row (heap and every index, as PostgreSQL reports them), extrapolated to a day."""
    with connection.cursor() as cursor:
        table = ChargedMinute._meta.db_table
        cursor.execute(
            "SELECT pg_relation_size(%s), pg_indexes_size(%s), pg_total_relation_size(%s), (SELECT count(*) FROM "
            + table
            + ")",
            [table, table, table],
        )
        heap, indexes, total, rows = cursor.fetchone()
    per_row = total / rows
    day_rows = size * MINUTES_PER_DAY
    figures = {
        "sample_rows": rows,
        "heap_bytes": heap,
        "index_bytes": indexes,
        "bytes_per_row": round(per_row, 1),
        "minute_rows_per_day": day_rows,
        "day_gib": round(per_row * day_rows / 2**30, 2),
        "kept_days": rollup.kept_days(),
    }
    figures.update(rollup_figures(size))
    return figures


def rollup_figures(size: int) -> dict[str, Any]:
    """Fold the ended holdings' minutes (a day old here) into daily rows; the summary's size per row."""
    began = time.perf_counter()
    outcome = rollup.roll_up(older_than=timedelta(hours=1))
    took = time.perf_counter() - began
    with connection.cursor() as cursor:
        table = UsageDay._meta.db_table
        cursor.execute(f"SELECT pg_total_relation_size(%s), (SELECT count(*) FROM {table})", [table])
        total, rows = cursor.fetchone()
    per_row = total / rows if rows else 0.0
    return {
        "rollup_s": round(took, 3),
        "rolled_minutes": outcome.minutes,
        "usage_days": outcome.days,
        "usage_day_bytes_per_row": round(per_row, 1),
        # A holding lasts at most a day (PORTAL_MAX_SESSION_HOURS): two daily rows at most, one on average.
        "usage_day_mib_per_day": round(per_row * size / 2**20, 2),
        "amount_kept": str(outcome.amount) if outcome.amount else str(Decimal(0)),
    }


if __name__ == "__main__":
    main([int(n) for n in sys.argv[1].split(",")], int(sys.argv[2]), int(sys.argv[3]))
