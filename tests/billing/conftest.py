"""Holdings of real slices for billing tests, and the clock they are measured by.

A holding is a slice the allocator handed out, with ``held_from`` (and ``held_until``) recorded the way
the notebook services record them. The meter reads the database's clock; a test moves time on by
moving every recorded moment back (``clock_moves_on``), which is what the minutes passing looks like
to the meter.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db.models import F, Sum

from billing import money, seeds
from billing.models import Entry, Price, Usage
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, Slice
from tests.gpus.conftest import use_fleet

A100 = SliceRequest(kind="whole", model="A100-80GB")
H200_3G = SliceRequest(kind="mig", profile="3g.71gb", model="H200")
A30_SHARE = SliceRequest(kind="shared", model="A30")
Hold = Callable[..., Slice]


@pytest.fixture
def fleet(db: None, settings) -> list[Gpu]:  # type: ignore[no-untyped-def]
    seeds.ensure(Price)  # a transactional test before this one may have flushed the migration's rows
    settings.MAX_SLICES_PER_USER = 50
    return use_fleet(settings, "bill: 1xH200:mig, 8xA100-80GB:whole, 1xA30:shared=3")


@pytest.fixture
def hold(fleet: list[Gpu]) -> Hold:
    """A slice held by ``owner`` since ``ago`` before the database's now (and until ``lasted`` after that),
    its container seen running now, as reconciliation would see it."""
    holder_ids = iter(range(1000, 100_000))

    def make(owner: User, ago: timedelta, request: SliceRequest = A100, lasted: timedelta | None = None) -> Slice:
        held = allocate(owner, request, holder=Holder.notebook(next(holder_ids)))
        start = database_now() - ago
        holdings.started(held.pk, start)
        if lasted is not None:
            holdings.ended(held.pk, start, start + lasted)
        holdings.seen([held.pk])
        held.refresh_from_db()
        return held

    return make


def clock_moves_on(minutes: float, seen: bool = True) -> None:
    """``minutes`` pass, as the meter sees it: every recorded moment lies that much further back (the
    allocations', the holdings', their proofs of life, the releases' and the prices staff added). ``seen``: the running
    holdings' containers were seen running all along (reconciliation's look now); else nobody could look."""
    step = timedelta(minutes=minutes)
    Slice.objects.filter(held_from__isnull=False).update(held_from=F("held_from") - step)
    Slice.objects.filter(seen_at__isnull=False).update(seen_at=F("seen_at") - step)
    Slice.objects.update(allocated_at=F("allocated_at") - step)
    Slice.objects.filter(held_until__isnull=False).update(held_until=F("held_until") - step)
    Slice.objects.filter(released_at__isnull=False).update(released_at=F("released_at") - step)
    Price.objects.filter(created_by__isnull=False).update(effective_from=F("effective_from") - step)
    Usage.objects.update(started=F("started") - step)
    Usage.objects.filter(ended__isnull=False).update(ended=F("ended") - step)
    if seen:
        holdings.seen(Slice.objects.values_list("pk", flat=True))


def end_holding(held: Slice, after: timedelta) -> datetime:
    """Record the end of a holding ``after`` its start, as the notebook services do."""
    held.refresh_from_db()
    assert held.held_from is not None
    until = held.held_from + after
    holdings.ended(held.pk, held.held_from, until)
    return until


def ledger_total() -> Decimal:
    return money.exact(Entry.objects.aggregate(total=Sum("amount"))["total"])


def unbalanced_transactions() -> list[int]:
    sums = Entry.objects.values("transaction_id").annotate(total=Sum("amount")).exclude(total=0)
    return [row["transaction_id"] for row in sums]
