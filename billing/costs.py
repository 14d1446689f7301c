"""What runs and what it burns: each running holding's cost so far at its frozen rate (its started minutes, as
billing/meter.py charges them), a person's wallet (balance, burn, time left), and the push that tells open pages
the balance moved. Every kind of workload alike: what holds a slice is named through ``sessions.gpus.workloads``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import User
from django.db.models import QuerySet

from billing import ledger, meter, money, prices
from billing.models import Usage
from portal import push
from portal.clock import database_now
from sessions.gpus import workloads
from sessions.gpus.models import Slice

log = logging.getLogger(__name__)
HOUR = Decimal(money.MINUTES_PER_HOUR)


@dataclass(frozen=True)
class Running:
    """A holding that runs now, as its owner sees it on the billing page and the session card."""

    held: Slice
    per_minute: Decimal
    minutes: int  # started so far, all of them due
    what: str
    counted_at: datetime  # the database's moment the minutes were counted at

    @property
    def cost(self) -> Decimal:
        return self.per_minute * self.minutes

    @property
    def per_hour(self) -> Decimal:
        return self.per_minute * HOUR

    @property
    def next_minute_in(self) -> float:
        """Seconds until the next minute starts, when the cost goes up again: by the database's clock, as the
        meter counts (a web process whose clock is behind would otherwise wait minutes to show it)."""
        assert self.held.held_from is not None
        due = self.held.held_from + timedelta(minutes=self.minutes)
        return max(1.0, (due - self.counted_at).total_seconds())


@dataclass(frozen=True)
class Wallet:
    balance: Decimal
    running: list[Running]

    @property
    def burn_per_hour(self) -> Decimal:
        return sum((r.per_hour for r in self.running), Decimal(0))

    @property
    def time_left(self) -> timedelta | None:
        """How long the balance lasts at the current burn; None while nothing burns."""
        if not self.burn_per_hour:
            return None
        hours = max(self.balance, Decimal(0)) / self.burn_per_hour
        return timedelta(seconds=int(hours * 3600))


def running_holdings(owner: User | int) -> QuerySet[Slice]:
    owner_id = owner if isinstance(owner, int) else owner.pk
    return Slice.objects.filter(
        owner_id=owner_id, held_from__isnull=False, held_until__isnull=True, released_at__isnull=True
    ).select_related("gpu__host")


def per_minute_of(held: Slice) -> Decimal | None:
    """The frozen rate of a holding: its usage's, or the price in force at its start before the meter has
    seen it (the same price the meter will freeze); None if no price covers it (it is not billed)."""
    return rates_of([held]).get(held.pk)


def rates_of(holdings: Sequence[Slice]) -> dict[int, Decimal]:
    """``per_minute_of`` for many holdings (their GPUs loaded) in at most two queries, whatever their number:
    the usages' frozen rates, then the prices in force at the starts of those the meter has not opened yet.
    A holding no price covers is left out."""
    ids = [held.pk for held in holdings]
    rates: dict[int, Decimal] = dict(Usage.objects.filter(slice_id__in=ids).values_list("slice_id", "per_minute"))
    unopened: list[Slice] = []
    wanted: list[tuple[prices.PriceKey, datetime]] = []
    for held in holdings:
        if held.pk not in rates and held.held_from is not None:
            unopened.append(held)
            wanted.append((prices.key_of(held, prices.market_of(held)), meter.quoted_at(held)))
    for held, price in zip(unopened, prices.in_force_at(wanted), strict=True):
        if price is not None:
            rates[held.pk] = prices.rate_of(price, held)
    return rates


def ended_at(held: Slice) -> datetime | None:
    """The end of a holding as the meter takes it: its container gone, or else its slice's release."""
    return held.held_until or held.released_at


def running_costs(holdings: Sequence[Slice], now: datetime | None = None) -> dict[int, Running]:
    """What each holding (its GPU loaded) has cost so far, by slice id, in a fixed number of queries whatever
    their number: the session cards, the billing page and the dashboard show many at once. Holdings no price
    covers, and those not begun, are left out; the database's clock is asked once, and only if needed."""
    begun = [held for held in holdings if held.held_from is not None]
    if not begun:
        return {}
    rates, names = rates_of(begun), _names(begun)
    now = now or database_now()
    found = {}
    for held in begun:
        if held.pk in rates:
            assert held.held_from is not None
            # By the clock, not capped at the last proof of life: what it will have cost once reconciliation (every
            # 20 s) confirms it runs, which the meter then charges; the history marks it "not yet charged".
            minutes = meter.minutes_due(held.held_from, ended_at(held), now, now)
            found[held.pk] = Running(held, rates[held.pk], minutes, _what(held, names), now)
    return found


def running(held: Slice, now: datetime | None = None) -> Running | None:
    return running_costs([held], now).get(held.pk)


def _names(holdings: Sequence[Slice]) -> dict[int, str]:
    """What their owners call the workloads that hold these slices (``workloads.names``), by slice."""
    holders = {held.pk: held.holder for held in holdings}
    named = workloads.names(holder for holder in holders.values() if holder is not None)
    return {slice_id: named[holder] for slice_id, holder in holders.items() if holder in named}


def _what(held: Slice, names: dict[int, str]) -> str:
    name = names.get(held.pk, "")
    return f"{name} · {held.describe()}" if name else held.describe()


def wallet(owner: User) -> Wallet:
    holdings = list(running_holdings(owner))
    costs = running_costs(holdings)  # the clock is asked only when something runs
    return Wallet(ledger.balance(owner), [costs[held.pk] for held in holdings if held.pk in costs])


def announce_charges() -> None:
    """Tell the open pages of everyone who holds a slice that their balance moved (after a meter tick)."""
    owners = Slice.objects.filter(held_from__isnull=False, held_until__isnull=True, released_at__isnull=True)
    for owner_id in set(owners.values_list("owner_id", flat=True)):
        push.notify_user(owner_id, {"type": "billing.charged"})
