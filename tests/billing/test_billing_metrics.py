"""Billing's counters on /metrics: the totals the meter keeps in the statement that bills equal the sum over
every usage after ticks, an outage caught up, a holding's end and a roll-up (on SQLite too), and a scrape
reads a few rows whatever the history: with 3 usages behind it and with 40, the same queries and, by
PostgreSQL's own EXPLAIN ANALYZE, the same rows, where the sum over the usages it replaced reads more
rows with every usage (the check that the measure can tell).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import DecimalField, F, Sum
from django.test.utils import CaptureQueriesContext

from billing import ledger, meter, rollup
from billing.metrics import BillingCollector
from billing.models import Account, BilledTotal, ChargedMinute, Usage
from sessions.gpus.allocator import SliceRequest, release
from tests.billing.conftest import A30_SHARE, H200_3G, Hold, clock_moves_on, end_holding

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's EXPLAIN")
H200_3G_SPOT = SliceRequest(kind="mig", profile="3g.71gb", model="H200", market="spot")
Key = tuple[str, str, str]


def totals() -> dict[Key, tuple[int, Decimal]]:
    return {(row.model_name, row.kind, row.market): (row.minutes, row.amount) for row in BilledTotal.objects.all()}


def usages_query() -> Any:
    """The sum over every usage: what a scrape read before the totals."""
    amount = Sum(F("billed_minutes") * F("per_minute"), output_field=DecimalField(max_digits=20, decimal_places=6))
    return (
        Usage.objects.values_list("slice__gpu__model_name", "slice__kind", "market")
        .annotate(total_minutes=Sum("billed_minutes"), total_amount=amount)
        .order_by()
    )


def over_usages() -> dict[Key, tuple[int, Decimal]]:
    return {(model, kind, market): (minutes, amount) for model, kind, market, minutes, amount in usages_query()}


def revenue_in_ledger() -> Decimal:
    kinds = [Account.Kind.REVENUE_ON_DEMAND, Account.Kind.REVENUE_SPOT]
    return sum((ledger.account_balance(kind) for kind in kinds), Decimal(0))


def test_the_totals_equal_the_sum_over_every_usage_as_the_meter_bills(hold: Hold, alice: User, bob: User) -> None:
    whole = hold(alice, timedelta(minutes=5))
    hold(bob, timedelta(minutes=3, seconds=20), H200_3G_SPOT)
    hold(alice, timedelta(minutes=2), A30_SHARE)
    meter.tick()
    first = totals()
    assert first == over_usages() and len(first) == 3
    assert sum(minutes for minutes, _ in first.values()) == 6 + 4 + 3
    clock_moves_on(10)  # the worker was down for ten minutes
    end_holding(whole, timedelta(minutes=12, seconds=1))
    meter.charge_holding(whole.pk)
    meter.tick()
    later = totals()
    assert later == over_usages() and later != first
    assert later[("A100-SXM4-80GB", "whole", "on_demand")][0] == 13
    assert sum(amount for _, amount in later.values()) == revenue_in_ledger()
    assert rollup.roll_up(older_than=timedelta(0)).usages == 1
    assert totals() == later  # folding the ended usage's minutes changes no total
    clock_moves_on(1)
    meter.tick()
    assert totals() == over_usages() != later


def test_a_scrape_shows_the_totals(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(minutes=2), H200_3G)
    meter.tick()
    families = {family.name: family for family in BillingCollector().collect()}
    (sample,) = families["portal_billed_minutes"].samples
    usage = Usage.objects.select_related("slice__gpu").get()
    assert sample.labels == {"model": usage.slice.gpu.model_name, "kind": "mig", "market": "on_demand"}
    assert sample.value == 3
    (revenue,) = families["portal_revenue"].samples
    assert revenue.value == pytest.approx(float(revenue_in_ledger()))


def rows_read(sql: str) -> int:
    """Rows PostgreSQL read from tables to answer ``sql``: each scan's rows returned and filtered out."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        found = cursor.fetchone()[0]
    plan = json.loads(found) if isinstance(found, str) else found

    def walk(node: dict[str, Any]) -> int:
        own = 0
        if "Relation Name" in node:
            returned = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            own = int(returned * node["Actual Loops"])
        return own + sum(walk(child) for child in node.get("Plans", []))

    return walk(plan[0]["Plan"])


def cost_of(read: Callable[[], object]) -> tuple[int, int]:
    """The number of queries ``read`` runs, and the rows they read."""
    with CaptureQueriesContext(connection) as queries:
        read()
    return len(queries), sum(rows_read(query["sql"]) for query in queries.captured_queries)


def scrape() -> None:
    list(BillingCollector().collect())


def ended_usages(hold: Hold, owner: User, count: int) -> None:
    """``count`` three-minute holdings two days ago, ended, released and charged: history."""
    for n in range(count):
        held = hold(owner, timedelta(days=2, minutes=5 * n), lasted=timedelta(minutes=3))
        release(held.pk)
    meter.tick()


@postgresql_only
def test_a_scrape_reads_the_same_rows_however_long_the_history(hold: Hold, alice: User, bob: User) -> None:
    hold(bob, timedelta(minutes=2), H200_3G)  # running now, through both measurements
    ended_usages(hold, alice, 3)
    scrape_small, old_small = cost_of(scrape), cost_of(lambda: list(usages_query()))
    ended_usages(hold, alice, 37)
    scrape_large, old_large = cost_of(scrape), cost_of(lambda: list(usages_query()))
    assert Usage.objects.count() == 41 and ChargedMinute.objects.count() >= 120
    assert scrape_small == scrape_large == (1, 2)  # one query, the two totals' rows (A100 whole, H200 MIG)
    assert old_large[1] >= old_small[1] + 37  # the sum over usages read every one of them
