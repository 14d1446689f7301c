"""The meter's two engines are one rule (issue 31, item 6): the set-based statements PostgreSQL runs
(``meter.charge_by_statements``) and the ORM loop SQLite runs (``meter.charge_by_loop``) leave the same books.

Random holdings of several people on every kind of slice (whole, MIG, time-sliced by 3 and by 2), on-demand and
spot; prices changed at random moments, some exactly at (or a microsecond beside) a holding's allocation, so
holdings freeze different rates; starts reported late, proofs of life stamped behind or ahead of the database's
clock, ends on, a microsecond before and a microsecond after a minute boundary, ends learnt late after the
holding was charged past them (the settlement), ends nobody can tell, releases without an end. At each meter run
(a tick, or one holding charged) the loop runs in a savepoint and is rolled back, then the statements run for
real, and everything either left is compared: each minute row with the ledger transaction that charged it, each
transaction's entries and memo, each usage, the slices metered, the accounts, /metrics' totals and the run's
Outcome. The history goes on from the statements' books, so later runs start from what they left.

PostgreSQL only: SQLite cannot run the statements. A fixed seed and 100 histories (several hundred runs of each
engine) in the default run, about 20 seconds; a longer one:

    PORTAL_METER_EXAMPLES=1000 .venv/bin/pytest tests/billing/test_meter_engines.py
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from billing import meter, seeds
from billing.models import Account, BilledTotal, ChargedMinute, Entry, LedgerTransaction, Market, Price, Usage
from billing.prices import PriceKey, add_price
from portal import clock
from portal.roles import USERS
from sessions.gpus import demand, holdings
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate, release
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from tests.billing.test_money_properties import REQUESTS, START
from tests.factories import make_user
from tests.gpus.conftest import use_fleet

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the set-based engine runs on PostgreSQL only"),
]
EXAMPLES = int(os.environ.get("PORTAL_METER_EXAMPLES", "100"))
MINUTE = timedelta(minutes=1)
MICROSECOND = timedelta(microseconds=1)
FLEET = "engines: 4xA100-80GB:whole, 1xH200:mig, 1xA30:shared=3, 1xL4:shared=2"
SLICES = {  # what a holding holds: the request, and its price key less the market
    "whole": (REQUESTS["whole"], ("A100-SXM4-80GB", "whole", "")),
    "mig": (REQUESTS["mig"], ("H200-SXM5-141GB", "mig", "1g.18gb")),
    "shared by 3": (REQUESTS["shared"], ("A30-24GB", "shared", "")),
    "shared by 2": (SliceRequest("shared", model="L4"), ("L4-24GB", "shared", "")),
}

# Moments: whole minutes after a holding's start, then on the boundary, a microsecond either side, or anywhere.
JITTER = st.one_of(st.sampled_from([0, -1, 1]), st.integers(0, 59_999_999)).map(lambda us: us * MICROSECOND)
SECONDS = st.integers(-180, 180).map(lambda s: s * timedelta(seconds=1))


def minutes_after(most: int) -> st.SearchStrategy[timedelta]:
    return st.builds(lambda minutes, jitter: minutes * MINUTE + jitter, st.integers(0, most), JITTER)


@dataclass(frozen=True)
class Ending:
    """How a holding ends: ``end`` (the engine's moment, ``at`` after the start, learnt ``late`` after it),
    ``unknown`` (learnt ``at`` after the start; it ends at its last proof of life) or ``release`` (the slice
    released ``at`` after the start with no end recorded)."""

    how: str
    at: timedelta
    late: timedelta


@dataclass(frozen=True)
class Plan:
    """One holding: whose, of what, on which market; allocated ``allocated`` after START, its container started
    ``starts`` after that (before it: an engine's clock behind), its start reported ``reported`` later; proofs
    of life stamped at moments after the start, each applied ``skew`` before its stamp (a clock ahead) or after."""

    owner: int
    what: str
    spot: bool
    allocated: timedelta
    starts: timedelta
    reported: timedelta
    proofs: tuple[tuple[timedelta, timedelta], ...]
    ending: Ending | None

    @property
    def start(self) -> datetime:
        return START + self.allocated + self.starts

    @property
    def quoted(self) -> datetime:
        """The moment whose price it pays (``meter.quoted_at``)."""
        return min(START + self.allocated, self.start)

    @property
    def key(self) -> PriceKey:
        return PriceKey(*SLICES[self.what][1], market=Market.SPOT if self.spot else Market.ON_DEMAND)


@dataclass(frozen=True)
class Repricing:
    """A new price for plan ``plan``'s key: at its quoted moment (``beside``: a microsecond off it), or at
    ``after`` past START when ``beside`` is None."""

    plan: int
    per_hour: Decimal
    beside: timedelta | None
    after: timedelta


@dataclass(frozen=True)
class Run:
    """A meter run ``at`` after plan ``plan``'s start: a tick of every holding, or that holding's alone."""

    plan: int
    at: timedelta
    one: bool


ENDINGS = st.one_of(
    st.none(),
    st.builds(Ending, st.just("end"), minutes_after(12), st.just(timedelta(0))),
    st.builds(Ending, st.just("end"), minutes_after(12), minutes_after(20)),  # learnt late: twice as likely,
    st.builds(Ending, st.just("end"), minutes_after(12), minutes_after(20)),  # the way to settlements
    st.builds(Ending, st.just("unknown"), minutes_after(15), st.just(timedelta(0))),
    st.builds(Ending, st.just("release"), minutes_after(12), st.just(timedelta(0))),
)
PLANS = st.builds(
    Plan,
    owner=st.integers(0, 2),
    what=st.sampled_from(sorted(SLICES)),
    spot=st.booleans(),
    allocated=st.integers(300, 900).map(lambda s: s * timedelta(seconds=1)) | JITTER.map(lambda j: 5 * MINUTE + j),
    starts=SECONDS,
    reported=st.one_of(st.just(timedelta(0)), minutes_after(8)),
    proofs=st.lists(st.tuples(minutes_after(15), SECONDS | JITTER), max_size=5).map(tuple),
    ending=ENDINGS,
)
PER_HOUR = st.one_of(
    st.sampled_from(["0", "0.0001", "0.0003", "8.5", "7.0001"]).map(Decimal),
    st.integers(1, 400_000).map(lambda n: Decimal(n).scaleb(-4)),
)
REPRICINGS = st.builds(
    Repricing,
    plan=st.integers(0, 5),
    per_hour=PER_HOUR,
    beside=st.none() | st.sampled_from([0, -1, 1]).map(lambda us: us * MICROSECOND),
    after=st.integers(1, 1800).map(lambda s: s * timedelta(seconds=1)),
)
RUNS = st.builds(Run, plan=st.integers(0, 5), at=minutes_after(25), one=st.booleans())


USAGE_FIELDS = [field.attname for field in Usage._meta.concrete_fields if not field.primary_key]
TOTAL_FIELDS = ["model_name", "kind", "market", "minutes", "amount"]


@dataclass(frozen=True)
class Books:
    """What a meter run leaves that anyone can see, without the keys and sequences two runs never share: each
    ledger transaction with its entries (by account kind and owner) and the minutes it charged (by slice), each
    usage by its slice, the slices metered, the accounts and /metrics' totals."""

    transactions: list[tuple[Any, ...]]
    usages: list[dict[str, Any]]
    metered: list[int]
    accounts: list[tuple[str, int | None]]
    totals: list[dict[str, Any]]

    @classmethod
    def read(cls) -> Books:
        return cls(
            transactions=_transactions(),
            usages=list(Usage.objects.order_by("slice_id").values(*USAGE_FIELDS)),
            metered=list(Slice.objects.filter(metered=True).order_by("pk").values_list("pk", flat=True)),
            accounts=sorted(Account.objects.values_list("kind", "user_id"), key=str),
            totals=[dict(row) for row in BilledTotal.objects.order_by(*TOTAL_FIELDS[:3]).values(*TOTAL_FIELDS)],
        )


def _transactions() -> list[tuple[Any, ...]]:
    """Each ledger transaction as what it says: kind, person, moment, memo, its entries and its minutes."""
    minutes: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for txn_id, slice_id, minute in ChargedMinute.objects.values_list("transaction_id", "usage__slice_id", "minute"):
        minutes[txn_id].append((slice_id, minute))
    entries: dict[int, list[tuple[str, int | None, Decimal]]] = defaultdict(list)
    rows = Entry.objects.values_list("transaction_id", "account__kind", "account__user_id", "amount")
    for txn_id, kind, user_id, amount in rows:
        entries[txn_id].append((kind, user_id, amount))
    return sorted(
        (
            (txn.kind, txn.user_id, txn.posted_at, txn.memo, sorted(entries[txn.pk], key=str), sorted(minutes[txn.pk]))
            for txn in LedgerTransaction.objects.all()
        ),
        key=str,
    )


def both_engines_agree(slice_id: int | None) -> None:
    """The loop in a savepoint, rolled back; then the statements for real, the history going on from their books.
    A tick skips a run in progress, a holding's own run waits for it: the statements are asked the same."""
    before = transaction.savepoint()
    by_loop = meter.charge_by_loop(slice_id), Books.read()
    transaction.savepoint_rollback(before)
    transaction.savepoint_commit(before)
    by_statements = meter.charge_by_statements(slice_id, wait=slice_id is not None), Books.read()
    assert not by_statements[0].skipped
    assert by_loop[0] == by_statements[0], "the engines' outcomes differ"
    assert by_loop[1] == by_statements[1], "the engines left different books"
    covered(by_statements[0])


def covered(outcome: meter.Outcome) -> None:
    """What the runs went through, in --hypothesis-show-statistics: the histories are not all idle."""
    for what, happened in [
        ("usages opened", outcome.usages_opened),
        ("minutes charged", outcome.minutes),
        ("charged past an end and settled", outcome.settled),
        ("a holding froze a repriced rate", Usage.objects.exclude(price__source=seeds.SOURCE).exists()),
    ]:
        if happened:
            event(what)


def release_at(slice_id: int, moment: datetime) -> None:
    """The slice is given back at ``moment`` with no end recorded: its holding ends at its release."""
    release(slice_id, "released")
    Slice.objects.filter(pk=slice_id).update(released_at=moment)


class History:
    """The plans on real slices, and their events in the database clock's order."""

    def __init__(self, plans: list[Plan]) -> None:
        self.plans = plans
        self.events: list[tuple[datetime, int, str, Callable[..., object], tuple[Any, ...]]] = []
        self.taken: dict[int, int] = {}

    def reprice(self, repricings: list[Repricing]) -> None:
        """New prices, added before any slice is allocated: later moments only, so none is refused as repricing."""
        for change in repricings:
            plan = self.plans[change.plan % len(self.plans)]
            moment = START + change.after if change.beside is None else plan.quoted + change.beside
            try:
                add_price(plan.key, change.per_hour, moment, by=None)
            except ValidationError as refused:
                assert refused.code == "duplicate", refused

    def allocate(self, owners: list[User]) -> None:
        """Every plan's slice, allocated at once (no plan waits for another's release) and dated as planned."""
        for number, plan in enumerate(self.plans):
            market = Slice.Market.SPOT if plan.spot else Slice.Market.ON_DEMAND
            request = SliceRequest(**{**SLICES[plan.what][0].__dict__, "market": market})
            try:
                taken = allocate(owners[plan.owner], request, Holder.notebook(number + 1))
            except AllocationRefused:
                continue
            Slice.objects.filter(pk=taken.pk).update(allocated_at=START + plan.allocated)
            self.taken[number] = taken.pk
            self._plan_events(taken.pk, plan)

    def _plan_events(self, slice_id: int, plan: Plan) -> None:
        start = plan.start
        self._add(start + plan.reported, f"slice {slice_id} started at {hms(start)}", holdings.started, slice_id, start)
        for stamped, skew in plan.proofs:
            seen = start + stamped
            self._add(seen - skew, f"slice {slice_id} seen at {hms(seen)}", holdings.seen, [slice_id], seen)
        ending = plan.ending
        if ending is None:
            return
        until = start + ending.at
        if ending.how == "end":
            label = f"slice {slice_id} ended at {hms(until)}"
            self._add(until + ending.late, label, holdings.end, slice_id, until, "ended", start)
            if ending.late:  # the beat's tick before the end is known: up to the proofs, perhaps past the end
                self._add(until + ending.late - MICROSECOND, "meter tick", both_engines_agree, None)
        elif ending.how == "unknown":
            label = f"slice {slice_id} lost: ends at its last proof of life"
            self._add(until, label, holdings.end, slice_id, None, "lost", start)
        else:
            self._add(until, f"slice {slice_id} released, no end recorded", release_at, slice_id, until)

    def meter_runs(self, runs: list[Run]) -> None:
        """The runs, and a last tick an hour after everything else, once every end is known."""
        for run in runs:
            number = run.plan % len(self.plans)
            slice_id = self.taken.get(number) if run.one else None
            label = f"meter run for slice {slice_id}" if slice_id else "meter tick"
            self._add(self.plans[number].start + run.at, label, both_engines_agree, slice_id)
        last = max((event[0] for event in self.events), default=START)
        self._add(last + timedelta(hours=1), "the last meter tick", both_engines_agree, None)

    def play(self) -> None:
        for at, _, label, action, args in sorted(self.events, key=lambda event: event[:2]):
            note(f"{hms(at)} {label}")
            clock.stop_at(at)
            action(*args)

    def _add(self, at: datetime, label: str, action: Callable[..., object], *args: Any) -> None:
        self.events.append((at, len(self.events), label, action, args))


def hms(moment: datetime) -> str:
    return f"{moment:%H:%M:%S.%f}"


@pytest.fixture
def fleet_of_every_kind(settings) -> list[User]:  # type: ignore[no-untyped-def]
    """Seeded prices, a fleet with every kind of slice (time-sliced by 3 and by 2), three owners; no credit check
    at launch, here only the meter is watched."""
    seeds.ensure(Price)
    use_fleet(settings, FLEET)
    settings.MAX_SLICES_PER_USER = 100
    settings.BILLING_MIN_MINUTES = 0
    return [make_user(f"owner{number}", [USERS]) for number in range(3)]


@pytest.mark.timeout(900)
@settings(
    max_examples=EXAMPLES,
    derandomize=True,  # a fixed seed in make test; PORTAL_METER_EXAMPLES makes a longer run
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plans=st.lists(PLANS, min_size=1, max_size=6),
    repricings=st.lists(REPRICINGS, max_size=5),
    runs=st.lists(RUNS, min_size=1, max_size=8),
)
def test_the_statements_and_the_loop_leave_the_same_books_at_every_run(
    fleet_of_every_kind: list[User], plans: list[Plan], repricings: list[Repricing], runs: list[Run]
) -> None:
    assert connection.vendor == "postgresql"
    start = transaction.savepoint()  # each history starts from the same books
    try:
        clock.stop_at(START)
        history = History(plans)
        history.reprice(repricings)
        history.allocate(fleet_of_every_kind)
        history.meter_runs(runs)
        history.play()
    finally:
        clock.stop_at(None)
        demand.forget()  # the MIG placement's memory of recent requests, which the rollback takes away
        transaction.savepoint_rollback(start)
        transaction.savepoint_commit(start)
