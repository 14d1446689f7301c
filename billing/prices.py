"""Prices: which rate holds for a slice at a moment, and adding a new price without repricing anything.

A price is keyed by GPU model, kind (MIG profile, whole GPU, time-sliced share) and market; it holds
from its ``effective_from`` until the next price of the same key. History is never changed: a new
price is a new row, refused when it would change the rate of a holding already begun.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q, QuerySet

from billing import money
from billing.models import Market, Price
from portal.clock import database_now
from sessions.gpus import catalog
from sessions.gpus.models import Slice

MAX_PER_HOUR = Decimal(100_000)  # more than any GPU an hour: a typo, not a price


@dataclass(frozen=True)
class PriceKey:
    model_name: str
    kind: str
    profile: str
    market: str


def key_of(held: Slice, market: str) -> PriceKey:
    """The price key of a slice (its GPU loaded); the meter's SQL says the same."""
    profile = held.profile if held.kind == Slice.Kind.MIG else ""
    return PriceKey(held.gpu.model_name, held.kind, profile, market)


def shares_of(held: Slice) -> int:
    """How many shares the rate of a holding is divided by: N of a time-sliced GPU, frozen at its allocation
    (``Slice.shares``); 1 for a whole GPU or a MIG slice. The meter's SQL says the same."""
    return max(held.shares, 1) if held.kind == Slice.Kind.SHARED else 1


def rate_of(price: Price, held: Slice) -> Decimal:
    """What one started minute of a holding costs at ``price``: the share rule, then the rounding rule."""
    return money.per_minute(price.per_hour, shares_of(held))


def market_of(held: Slice) -> str:
    """The market the slice was allocated on (``Slice.market``); the meter's SQL reads the same column."""
    return Market.SPOT if held.market == Slice.Market.SPOT else Market.ON_DEMAND


def in_force(key: PriceKey, at: datetime) -> Price | None:
    return _of(key).filter(effective_from__lte=at).order_by("-effective_from").first()


def in_force_at(wanted: Sequence[tuple[PriceKey, datetime]]) -> list[Price | None]:
    """``in_force`` for many (key, moment) pairs in one query: every price of those keys that began by the
    latest of the moments (a handful per key: prices change rarely), then the newest by each moment."""
    if not wanted:
        return []
    match = Q()
    for key in {key for key, _ in wanted}:
        match |= Q(model_name=key.model_name, kind=key.kind, profile=key.profile, market=key.market)
    latest = max(at for _, at in wanted)
    by_key: dict[PriceKey, list[Price]] = defaultdict(list)
    for price in Price.objects.filter(match, effective_from__lte=latest).order_by("-effective_from"):
        by_key[PriceKey(price.model_name, price.kind, price.profile, price.market)].append(price)
    return [next((p for p in by_key[key] if p.effective_from <= at), None) for key, at in wanted]


def _of(key: PriceKey) -> QuerySet[Price]:
    return Price.objects.filter(model_name=key.model_name, kind=key.kind, profile=key.profile, market=key.market)


def current() -> list[Price]:
    """The price in force now for every key, in the table's order."""
    newest: dict[PriceKey, Price] = {}
    now = database_now()
    for price in Price.objects.filter(effective_from__lte=now).order_by("effective_from"):
        newest[PriceKey(price.model_name, price.kind, price.profile, price.market)] = price
    return sorted(newest.values(), key=lambda p: (p.model_name, p.kind != "whole", p.kind, p.per_hour, p.market))


def parse_per_hour(value: object) -> Decimal:
    """An hourly price from a form or a caller: a number, not negative, at most four decimals."""
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value).strip())
    except InvalidOperation:
        raise ValidationError("A price is a number, e.g. 8.5.", code="not_a_number") from None
    if not amount.is_finite():
        raise ValidationError("A price is a number, e.g. 8.5.", code="not_a_number")
    if amount < 0:
        raise ValidationError("A price cannot be negative.", code="negative")
    if money.decimals(amount) > money.RATE_PLACES:
        raise ValidationError(
            f"A price per hour has at most {money.RATE_PLACES} decimals (got {amount}).", code="too_many_decimals"
        )
    if amount > MAX_PER_HOUR:
        raise ValidationError(f"{amount} an hour is more than any GPU costs; check the figure.", code="absurd")
    return amount


def check_key(key: PriceKey) -> None:
    try:
        model = catalog.model(key.model_name)
    except catalog.UnknownModel as error:
        raise ValidationError(str(error), code="unknown_model") from None
    if key.kind not in Slice.Kind.values or key.market not in Market.values:
        raise ValidationError("Unknown kind or market.", code="unknown_kind")
    if key.kind == Slice.Kind.MIG:
        try:
            model.profile(key.profile)
        except catalog.UnknownProfile as error:
            raise ValidationError(str(error), code="unknown_profile") from None
    elif key.profile:
        raise ValidationError("Only a MIG price names a profile.", code="profile_without_mig")


def add_price(key: PriceKey, per_hour: object, effective_from: datetime, by: User | None, source: str = "") -> Price:
    """Record a new price from ``effective_from`` on, or refuse it with the reason (``check_moment``)."""
    amount = parse_per_hour(per_hour)
    check_key(key)
    with transaction.atomic():
        _lock_key(key)
        check_moment(key, effective_from)
        price = Price(**key.__dict__, per_hour=amount, effective_from=effective_from, created_by=by, source=source)
        price.save()
    return price


def check_moment(key: PriceKey, effective_from: datetime) -> None:
    """Refuse a moment a price of this key already starts at, and a moment in the past when a slice of this
    key was allocated since then (up to the next price): its frozen rate would no longer be the one quoted."""
    if _of(key).filter(effective_from=effective_from).exists():
        raise ValidationError("A price of this kind already starts at that moment.", code="duplicate")
    if effective_from <= database_now():  # a slice allocated this very moment was quoted the price in force now
        repriced = _holdings_repriced(key, effective_from)
        if repriced:
            raise ValidationError(
                f"{repriced} slice(s) of this kind were allocated since {effective_from:%Y-%m-%d %H:%M} UTC, and"
                " run or were billed at the price then in force; a new price can only apply from now on.",
                code="reprices",
            )


def _lock_key(key: PriceKey) -> None:
    """Two staff adding prices of one key at once take turns (PostgreSQL; SQLite writes one at a time)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"price:{key}"])


def _holdings_repriced(key: PriceKey, since: datetime) -> int:
    """Holdings of the key allocated since ``since`` (before the next price): each pays the price in force at
    its allocation, what its launch quoted (``meter.quoted_at``), so a new price from ``since`` would reprice them."""
    later = _of(key).filter(effective_from__gt=since).order_by("effective_from").first()
    quoted = Q(allocated_at__gte=since) & (Q(held_from__isnull=True) | Q(held_from__gte=since))
    if later is not None:
        quoted &= Q(allocated_at__lt=later.effective_from) | Q(held_from__lt=later.effective_from)
    held = Slice.objects.filter(quoted, gpu__model_name=key.model_name, kind=key.kind)
    if key.kind == Slice.Kind.MIG:
        held = held.filter(profile=key.profile)
    return held.filter(market=Slice.Market.SPOT if key.market == Market.SPOT else Slice.Market.ON_DEMAND).count()
