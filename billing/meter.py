"""The meter: every started minute of every holding of a slice is charged exactly once, and a holding pays
exactly the minutes that began before its end.

A holding runs from ``Slice.held_from`` to ``Slice.held_until`` (its container's start and the moment it
was gone); a released slice without an end moment ended at its release. Minute k of a holding starts k
minutes after its start. While it runs, a minute is due once it has begun before the holding's last proof
of life (``Slice.seen_at``: the engine or the worker following it saw the container running then), by the
database's clock (never a process's, never by counting ticks): a holding nobody can confirm is not charged
past that proof until it is confirmed again, when the minutes between are caught up. Once it has ended,
every minute that began before the end is due, and always the first; minutes charged past the end (a proof
by a clock ahead of the engine's) are given back by a balanced settlement that says why, their rows gone
with it. Each due minute is a ``ChargedMinute`` row, unique per (usage, minute), inserted in the same
database transaction as the ledger entries that charge it: a tick that dies leaves nothing, a tick that
runs twice finds nothing left to do, and an outage is caught up by the next tick in one go. The same
statement adds what it billed to /metrics' totals (``BilledTotal``). The rate is frozen from the price in
force when the slice was allocated (what the launch quoted), for the share count frozen then.

The rule is written once, by ``minutes_due`` and the rate rule (``prices.rate_of``); two engines run it.
PostgreSQL runs ``charge_by_statements``: a constant number of set-based statements, whatever the number
of usages, with one ledger transaction per person per tick; a second tick meanwhile returns at once (an
advisory try-lock). SQLite, the zero-config default, runs ``charge_by_loop``: the rule as a plain ORM loop,
which runs on PostgreSQL too. A property test proves the two equal (tests/billing/test_meter_engines.py):
random holdings, price changes, proofs of life and ends on and beside minute boundaries, both engines run on
the same books at each tick, and every minute row, usage, ledger entry and total they leave compared.
Settlements are rare (a clock ahead, an end learnt late) and run one usage at a time, the same code for both.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import F

from billing import ledger, money, prices
from billing.models import Account, BilledTotal, ChargedMinute, Entry, LedgerTransaction, Market, Price, Usage
from portal import clock
from portal.clock import database_now
from sessions.gpus.holders import HolderKind
from sessions.gpus.models import Gpu, Slice

log = logging.getLogger(__name__)
LOCK_KEY = 0x6269_6C6C_6D65_7465  # "billmete": one meter at a time
LOCK_TIMEOUT = "10s"  # a row lock held this long by someone else: give up this tick, the next one catches up
MINUTE = timedelta(minutes=1)
PORTAL_ACCOUNTS = [Account.Kind.REVENUE_ON_DEMAND, Account.Kind.REVENUE_SPOT]
T = {
    "slice": Slice._meta.db_table,
    "gpu": Gpu._meta.db_table,
    "price": Price._meta.db_table,
    "usage": Usage._meta.db_table,
    "minute": ChargedMinute._meta.db_table,
    "txn": LedgerTransaction._meta.db_table,
    "entry": Entry._meta.db_table,
    "account": Account._meta.db_table,
    "total": BilledTotal._meta.db_table,
}


@dataclass(frozen=True)
class Outcome:
    """What one run of the meter did; ``skipped`` when another run held the meter."""

    skipped: bool = False
    usages_opened: int = 0
    minutes: int = 0
    transactions: int = 0
    amount: Decimal = Decimal(0)
    settled: int = 0  # usages charged past their end, settled to it
    given_back: Decimal = Decimal(0)


def minutes_due(started: datetime, ended: datetime | None, now: datetime, seen: datetime | None = None) -> int:
    """How many minutes of a holding are due: the rule, in exact integer microseconds (SQL mirrors it).

    Ended: every minute begun before the end, at least the first. Running: every minute begun by the
    database's ``now`` and by the last proof of life ``seen`` (None: none beyond its start)."""
    if ended is not None:
        return max(1, -(-(ended - started) // timedelta(microseconds=1) // 60_000_000))
    proven = min(now, max(seen or started, started))
    return max(0, (proven - started) // MINUTE + 1)


def tick() -> Outcome:
    """Charge every minute that has become due, for every holding; the beat task calls this each minute."""
    return _run(slice_id=None, wait=False)


def charge_all() -> Outcome:
    """``tick``, but waiting for a tick in progress rather than skipping: what must be charged before it goes on
    (the month's invoices)."""
    return _run(slice_id=None, wait=True)


def charge_holding(slice_id: int) -> Outcome:
    """Charge one holding up to now, or to its end (its last, partial minute) once it has ended.

    Waits for a tick in progress rather than skipping: the end of a holding is charged at once.
    """
    return _run(slice_id=slice_id, wait=True)


def _run(slice_id: int | None, wait: bool) -> Outcome:
    if connection.vendor == "postgresql":
        return charge_by_statements(slice_id, wait)
    return charge_by_loop(slice_id)


def charge_by_statements(slice_id: int | None, wait: bool) -> Outcome:
    """The set-based engine (PostgreSQL only): every holding, or the one slice's, charged up to now in one
    transaction; ``wait``: wait for a run in progress rather than skip."""
    with transaction.atomic():
        return _run_sql(slice_id, wait)


def charge_by_loop(slice_id: int | None) -> Outcome:
    """The same rule as a plain ORM loop, one usage at a time, in one transaction: SQLite's engine, and on
    PostgreSQL the reference the property test holds the statements to. It takes no lock: SQLite serialises
    writers by its file lock."""
    with transaction.atomic():
        return _run_python(slice_id)


# PostgreSQL: six statements per run, whatever the number of usages or the length of the history.

OPEN_USAGES = """
WITH held AS (
    -- The slice_unmetered_idx partial index: only holdings the meter has not opened, whatever the history.
    SELECT s.* FROM {slice} s WHERE s.held_from IS NOT NULL AND NOT s.metered {slice_filter}
), opened AS (
    INSERT INTO {usage} (slice_id, owner_id, holder_kind, holder_id, market, price_id, per_minute, shares,
                         started, ended, billed_minutes, open, folded)
    SELECT s.id, s.owner_id, s.holder_kind, s.holder_id, k.market, p.id,
           ROUND(p.per_hour / (60 * k.shares), {places}), k.shares, s.held_from,
           k.ended, 0, true, false
    FROM held s
    JOIN {gpu} g ON g.id = s.gpu_id
    CROSS JOIN LATERAL (
        SELECT s.market AS market,
               CASE WHEN s.kind = 'mig' THEN s.profile ELSE '' END AS profile,
               CASE WHEN s.kind = 'shared' THEN GREATEST(s.shares, 1) ELSE 1 END AS shares,
               -- GREATEST skips NULLs in PostgreSQL: a holding with no end must stay without one.
               CASE WHEN COALESCE(s.held_until, s.released_at) IS NOT NULL
                    THEN GREATEST(COALESCE(s.held_until, s.released_at), s.held_from) END AS ended
    ) k
    JOIN LATERAL (
        SELECT p.id, p.per_hour FROM {price} p
        WHERE p.model_name = g.model_name AND p.kind = s.kind AND p.profile = k.profile AND p.market = k.market
          AND p.effective_from <= LEAST(s.allocated_at, s.held_from)
        ORDER BY p.effective_from DESC LIMIT 1
    ) p ON true
    WHERE NOT EXISTS (SELECT 1 FROM {usage} u WHERE u.slice_id = s.id)
    ON CONFLICT (slice_id) DO NOTHING
    RETURNING slice_id, owner_id
), marked AS (
    -- A holding with no price yet stays unmarked, so it is opened once one is added.
    UPDATE {slice} s SET metered = true
    WHERE s.id IN (SELECT slice_id FROM opened)
       OR (s.id IN (SELECT id FROM held) AND EXISTS (SELECT 1 FROM {usage} u WHERE u.slice_id = s.id))
), accounts AS (
    INSERT INTO {account} (kind, user_id)
    SELECT DISTINCT 'wallet', owner_id FROM opened
    ON CONFLICT (kind, user_id) WHERE user_id IS NOT NULL DO NOTHING
)
SELECT count(*) FROM opened
"""

PORTAL_ACCOUNTS_SQL = """
INSERT INTO {account} (kind, user_id) SELECT kind, NULL FROM unnest(%s::text[]) AS kind
ON CONFLICT (kind) WHERE user_id IS NULL DO NOTHING
"""

# Minutes due: the SQL of minutes_due(). The ledger is written from what the minute insert RETURNED,
# so a minute someone else already charged is never paid twice. A usage charged past its end is left to
# the settlement (``_settle``), whose ids the statement returns.
CHARGE = """
WITH due AS (
    SELECT u.id, u.owner_id, u.market, u.per_minute, u.billed_minutes AS first, e.ended, s.gpu_id, s.kind,
           GREATEST(u.billed_minutes, CASE
               WHEN e.ended IS NOT NULL THEN GREATEST(1, CEIL(EXTRACT(EPOCH FROM e.ended - u.started) / 60))
               ELSE FLOOR(EXTRACT(EPOCH FROM
                   LEAST(%(now)s, GREATEST(COALESCE(s.seen_at, u.started), u.started)) - u.started) / 60) + 1
               END)::integer AS upto,
           e.ended IS NOT NULL
               AND GREATEST(1, CEIL(EXTRACT(EPOCH FROM e.ended - u.started) / 60)) < u.billed_minutes AS over
    FROM {usage} u
    JOIN {slice} s ON s.id = u.slice_id
    CROSS JOIN LATERAL (
        SELECT CASE WHEN u.ended IS NOT NULL THEN u.ended
                    WHEN COALESCE(s.held_until, s.released_at) IS NOT NULL
                    THEN GREATEST(COALESCE(s.held_until, s.released_at), u.started) END AS ended
    ) e
    WHERE u.open {usage_filter}
), payers AS (
    SELECT DISTINCT owner_id FROM due WHERE upto > first
), txn AS (
    INSERT INTO {txn} (kind, posted_at, user_id, memo, created_by_id, reverses_id)
    SELECT 'usage', %(now)s, owner_id, 'per-minute charges', NULL, NULL FROM payers
    RETURNING id, user_id
), charged AS (
    INSERT INTO {minute} (usage_id, minute, transaction_id)
    SELECT d.id, m, t.id
    FROM due d JOIN txn t ON t.user_id = d.owner_id CROSS JOIN LATERAL generate_series(d.first, d.upto - 1) AS m
    WHERE d.upto > d.first
    ON CONFLICT (usage_id, minute) DO NOTHING
    RETURNING usage_id, transaction_id
), sums AS (
    SELECT c.transaction_id, d.owner_id, d.market, SUM(d.per_minute) AS amount
    FROM charged c JOIN due d ON d.id = c.usage_id
    GROUP BY c.transaction_id, d.owner_id, d.market
), posted AS (
    INSERT INTO {entry} (transaction_id, account_id, amount)
    SELECT s.transaction_id, a.id, -s.amount FROM sums s
        JOIN {account} a ON a.kind = 'wallet' AND a.user_id = s.owner_id
    UNION ALL
    SELECT s.transaction_id, a.id, s.amount FROM sums s JOIN {account} a ON a.kind = 'revenue_' || s.market
        AND a.user_id IS NULL
    RETURNING amount
), counted AS (
    -- /metrics' totals, a few rows: added to as billed_minutes moves on below, in this one statement.
    INSERT INTO {total} AS t (model_name, kind, market, minutes, amount)
    SELECT g.model_name, x.kind, x.market, SUM(x.minutes), SUM(x.amount)
    FROM (SELECT gpu_id, kind, market, SUM(upto - first) AS minutes, SUM((upto - first) * per_minute) AS amount
          FROM due WHERE upto > first GROUP BY gpu_id, kind, market) x
    JOIN {gpu} g ON g.id = x.gpu_id
    GROUP BY g.model_name, x.kind, x.market
    ON CONFLICT (model_name, kind, market)
    DO UPDATE SET minutes = t.minutes + EXCLUDED.minutes, amount = t.amount + EXCLUDED.amount
), moved AS (
    UPDATE {usage} u SET billed_minutes = d.upto, ended = d.ended, open = d.ended IS NULL
    FROM due d WHERE u.id = d.id AND NOT d.over AND (d.upto > d.first OR d.ended IS NOT NULL)
    RETURNING u.id
)
SELECT (SELECT count(*) FROM charged), (SELECT count(*) FROM txn),
       (SELECT COALESCE(SUM(amount), 0) FROM posted WHERE amount > 0), (SELECT count(*) FROM moved),
       (SELECT COALESCE(array_agg(id ORDER BY id), '{{}}') FROM due WHERE over)
"""


def _run_sql(slice_id: int | None, wait: bool) -> Outcome:
    with connection.cursor() as cursor:
        # generate_series' 1,000-row guess tips the planner into JIT, which costs seconds at 100,000 usages.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        # The database's now comes with the lock (its transaction's start), and is the statements' now.
        if wait:
            cursor.execute("SELECT true, now() FROM (SELECT pg_advisory_xact_lock(%s)) AS locked", [LOCK_KEY])
        else:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s), now()", [LOCK_KEY])
        locked, now = cursor.fetchone()
        if not locked:
            return Outcome(skipped=True)
        params = {"now": clock.stopped() or now, "slice": slice_id}
        slice_filter = "AND s.id = %(slice)s" if slice_id is not None else ""
        cursor.execute(OPEN_USAGES.format(**T, places=money.AMOUNT_PLACES, slice_filter=slice_filter), params)
        opened = cursor.fetchone()[0]
        cursor.execute(PORTAL_ACCOUNTS_SQL.format(**T), [[str(kind) for kind in PORTAL_ACCOUNTS]])
        usage_filter = "AND u.slice_id = %(slice)s" if slice_id is not None else ""
        cursor.execute(CHARGE.format(**T, usage_filter=usage_filter), params)
        minutes, transactions, amount, _, over = cursor.fetchone()
    settled, given_back = _settle_all(over)
    return Outcome(False, opened, minutes, transactions, Decimal(amount), settled, given_back)


# The loop: the same rule, one usage at a time, plain ORM (any database); SQLite's writes are serialised by its
# file lock.


def _run_python(slice_id: int | None) -> Outcome:
    now = database_now()
    opened = _open_usages(slice_id)
    usages = Usage.objects.filter(open=True).select_related("slice__gpu").order_by("id")
    if slice_id is not None:
        usages = usages.filter(slice_id=slice_id)
    owed: dict[int, list[tuple[Usage, int]]] = defaultdict(list)
    billed: dict[tuple[str, str, str], tuple[int, Decimal]] = defaultdict(lambda: (0, Decimal(0)))
    over: list[int] = []
    for usage in usages:
        if usage.ended is None and (usage.slice.held_until or usage.slice.released_at):
            usage.ended = max(usage.slice.held_until or usage.slice.released_at, usage.started)  # type: ignore[type-var]
        due = minutes_due(usage.started, usage.ended, now, usage.slice.seen_at)
        if usage.ended is not None and due < usage.billed_minutes:
            over.append(usage.pk)
            continue
        upto = max(usage.billed_minutes, due)
        owed[usage.owner_id].append((usage, upto))
        key, more = (usage.slice.gpu.model_name, usage.slice.kind, usage.market), upto - usage.billed_minutes
        billed[key] = (billed[key][0] + more, billed[key][1] + more * usage.per_minute)
    minutes, transactions, amount = 0, 0, Decimal(0)
    for owner_id, owing in owed.items():
        charged = _charge_owner(owner_id, owing, now)
        if charged:
            minutes, transactions, amount = minutes + charged[0], transactions + 1, amount + charged[1]
    _add_to_totals(billed)
    settled, given_back = _settle_all(over)
    return Outcome(False, opened, minutes, transactions, amount, settled, given_back)


def _add_to_totals(billed: dict[tuple[str, str, str], tuple[int, Decimal]]) -> None:
    """/metrics' totals move on with the usages' billed_minutes, in the same transaction."""
    for (model_name, kind, market), (minutes, amount) in billed.items():
        if minutes:
            found, _ = BilledTotal.objects.get_or_create(model_name=model_name, kind=kind, market=market)
            BilledTotal.objects.filter(pk=found.pk).update(minutes=F("minutes") + minutes, amount=F("amount") + amount)


def quoted_at(held: Slice) -> datetime:
    """The moment whose price a holding pays: its allocation's, what the launch quoted (its start, if a clock
    behind put that first); the meter's SQL says the same."""
    assert held.held_from is not None
    return min(held.allocated_at, held.held_from)


def _open_usages(slice_id: int | None) -> int:
    held = Slice.objects.filter(held_from__isnull=False, metered=False).select_related("gpu")
    if slice_id is not None:
        held = held.filter(pk=slice_id)
    opened = 0
    for found in held:
        assert found.held_from is not None
        if Usage.objects.filter(slice=found).exists():
            Slice.objects.filter(pk=found.pk).update(metered=True)
            continue
        market = prices.market_of(found)
        price = prices.in_force(prices.key_of(found, market), quoted_at(found))
        if price is None:
            log.warning("slice %s has no price for its holding; it is not billed until one is added", found.pk)
            continue
        end = found.held_until or found.released_at
        Usage.objects.create(
            slice=found,
            owner_id=found.owner_id,
            holder_kind=found.holder_kind,
            holder_id=found.holder_id,
            market=market,
            price=price,
            per_minute=prices.rate_of(price, found),
            shares=prices.shares_of(found),
            started=found.held_from,
            ended=max(end, found.held_from) if end else None,
        )
        Slice.objects.filter(pk=found.pk).update(metered=True)
        Account.objects.get_or_create(kind=Account.Kind.WALLET, user_id=found.owner_id)
        opened += 1
    return opened


def _charge_owner(owner_id: int, owing: list[tuple[Usage, int]], now: datetime) -> tuple[int, Decimal] | None:
    """One ledger transaction for what one person owes this run; None if nothing was due."""
    posted = None
    if any(upto > usage.billed_minutes for usage, upto in owing):
        posted = LedgerTransaction.objects.create(
            kind=LedgerTransaction.Kind.USAGE, user_id=owner_id, memo="per-minute charges", posted_at=now
        )
    by_market: dict[str, Decimal] = defaultdict(Decimal)
    count = 0
    for usage, upto in owing:
        if posted is not None and upto > usage.billed_minutes:
            rows = [ChargedMinute(usage=usage, minute=m, transaction=posted) for m in range(usage.billed_minutes, upto)]
            fresh = _insert_new(usage, rows)
            by_market[usage.market] += usage.per_minute * fresh
            count += fresh
        Usage.objects.filter(pk=usage.pk).update(billed_minutes=upto, ended=usage.ended, open=usage.ended is None)
    if posted is None:
        return None
    _post_entries(posted, owner_id, by_market)
    return count, sum(by_market.values(), Decimal(0))


def _insert_new(usage: Usage, rows: list[ChargedMinute]) -> int:
    """Insert the minute rows not already there; the number inserted is what is charged."""
    taken = set(
        ChargedMinute.objects.filter(usage=usage, minute__in=[row.minute for row in rows]).values_list(
            "minute", flat=True
        )
    )
    fresh = [row for row in rows if row.minute not in taken]
    ChargedMinute.objects.bulk_create(fresh)
    return len(fresh)


def _post_entries(posted: LedgerTransaction, owner_id: int, by_market: dict[str, Decimal]) -> None:
    wallet = Account.objects.get(kind=Account.Kind.WALLET, user_id=owner_id)
    entries = []
    for market, amount in by_market.items():
        revenue_kind = Account.Kind.REVENUE_SPOT if market == Market.SPOT else Account.Kind.REVENUE_ON_DEMAND
        revenue, _ = Account.objects.get_or_create(kind=revenue_kind, user=None)
        entries += [
            Entry(transaction=posted, account=wallet, amount=-amount),
            Entry(transaction=posted, account=revenue, amount=amount),
        ]
    Entry.objects.bulk_create(entries)


# Settling a usage charged past its end: rare, one usage at a time on both databases.


def _settle_all(usage_ids: list[int]) -> tuple[int, Decimal]:
    """Settle each of these usages to its end; how many, and what was given back."""
    given_back = [_settle(usage_id) for usage_id in usage_ids]
    return len(given_back), sum(given_back, Decimal(0))


def _settle(usage_id: int) -> Decimal:
    """A usage whose end is now known was charged for minutes that began after it (a proof of life by a clock
    ahead of the engine's, an end learnt late): those minutes are given back by one balanced settlement that
    says why, their rows removed with it, /metrics' totals taken down and the usage closed at its end.
    Returns the amount given back. Runs inside the meter's transaction and lock."""
    usage = Usage.objects.select_related("slice__gpu").get(pk=usage_id)
    end = usage.ended or usage.slice.held_until or usage.slice.released_at
    assert end is not None, "only an ended usage is settled"
    end = max(end, usage.started)
    owed = minutes_due(usage.started, end, end)
    extra = ChargedMinute.objects.filter(usage=usage, minute__gte=owed)
    count = extra.count()
    amount = usage.per_minute * count
    if count:
        revenue = Account.Kind.REVENUE_SPOT if usage.market == Market.SPOT else Account.Kind.REVENUE_ON_DEMAND
        ledger.post(
            LedgerTransaction.Kind.SETTLEMENT,
            [(ledger.wallet_of(usage.owner_id), amount), (ledger.portal_account(revenue), -amount)],
            memo=settlement_memo(usage, count, end),
            user_id=usage.owner_id,
        )
        extra.delete()
        key = {"model_name": usage.slice.gpu.model_name, "kind": usage.slice.kind, "market": usage.market}
        BilledTotal.objects.filter(**key).update(minutes=F("minutes") - count, amount=F("amount") - amount)
    Usage.objects.filter(pk=usage.pk).update(billed_minutes=owed, ended=end, open=False)
    log.info("usage %s was charged %s minute(s) past its end at %s; given back %s", usage.pk, count, end, amount)
    return amount


def settlement_memo(usage: Usage, count: int, end: datetime) -> str:
    """Why the money came back, in the words its owner reads on the billing page."""
    holder = f"{HolderKind(usage.holder_kind).label} #{usage.holder_id}" if usage.holder_kind else "a slice"
    minutes = "minute" if count == 1 else "minutes"
    return (
        f"{count} {minutes} charged after {holder} ended at {end:%Y-%m-%d %H:%M:%S} UTC given back: "
        "a holding pays only the minutes that began before its end."
    )
