"""Cost before launch: billing's answer to the notebook services' pricing seam (sessions/gpus/pricing.py)
and the workloads' gate (sessions/gpus/workloads.py).

The launch form shows each offer's price per hour, on-demand and spot, and how long the person's balance
lasts at each. The gate is asked before any slice goes to any workload (a notebook launch, a render job's
probe, its further slices, a retry's, a spot hand-over): none goes to someone whose credit ran out (an open
zero-balance warning), nor one the balance cannot carry for PORTAL_BILLING_MIN_MINUTES together with what
already runs; and nobody commits to a cost (a render job's whole estimate) the balance does not cover.
Registered by BillingConfig.ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.models import User
from django.db.models import Min

from billing import costs, credit, ledger, money, prices
from billing.models import Market
from portal.clock import database_now
from sessions.gpus import catalog
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, Slice
from sessions.gpus.pricing import OfferPrice, WalletLine


def per_minute(request: SliceRequest, market: str) -> Decimal | None:
    """What a started minute of this offer costs now (a time-sliced share: 1/N of the GPU's price)."""
    return per_minutes([request], [market])[request, market]


def per_minutes(
    requests: Sequence[SliceRequest], markets: Sequence[str]
) -> dict[tuple[SliceRequest, str], Decimal | None]:
    """``per_minute`` of every offer on every market, in at most three queries whatever their number: the
    database's clock, the prices in force then, and the share limits of the time-sliced models asked for."""
    if not requests:
        return {}
    now = database_now()
    wanted = [(request, market) for request in requests for market in markets]
    found = prices.in_force_at([(_key(request, market), now) for request, market in wanted])
    shares = _shares([catalog.resolve(request.model) for request in requests if request.kind == Slice.Kind.SHARED])
    return {
        (request, market): None
        if price is None
        else money.per_minute(price.per_hour, shares.get(catalog.resolve(request.model), 1))
        for (request, market), price in zip(wanted, found, strict=True)
    }


def _key(request: SliceRequest, market: str) -> prices.PriceKey:
    profile = request.profile if request.kind == Slice.Kind.MIG else ""
    return prices.PriceKey(catalog.resolve(request.model), request.kind, profile, market)


def _shares(models: Sequence[str]) -> dict[str, int]:
    """The fewest shares of a time-sliced GPU of each model: the dearest a share can be, never a lower figure
    than charged (a model with no such GPU: 1)."""
    if not models:
        return {}
    limits = (
        Gpu.objects.filter(model_name__in=set(models), sharing=Gpu.Sharing.SHARED)
        .values("model_name")
        .annotate(fewest=Min("share_limit"))
    )
    return {row["model_name"]: max(row["fewest"], 1) for row in limits}


def lasts(balance: Decimal, rate: Decimal | None) -> str:
    """How long a balance carries a per-minute rate, in words."""
    if not rate:
        return ""
    minutes = int(max(balance, Decimal(0)) / rate)
    return duration(timedelta(minutes=minutes))


def duration(span: timedelta) -> str:
    minutes = int(span.total_seconds() // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest:02d} min" if hours < 48 else f"{hours // 24} days"


class BillingPricing:
    def prices(self, owner: User, requests: Sequence[SliceRequest]) -> dict[SliceRequest, OfferPrice]:
        """Every offer's prices in a fixed number of queries, however many offers the fleet has."""
        rates = per_minutes(requests, [Market.ON_DEMAND, Market.SPOT])
        balance = ledger.balance(owner) if requests else Decimal(0)
        priced = {}
        for request in requests:
            on_demand, spot = rates[request, Market.ON_DEMAND], rates[request, Market.SPOT]
            if on_demand is None and spot is None:
                continue
            priced[request] = OfferPrice(
                per_hour=_hourly(on_demand),
                spot_per_hour=_hourly(spot) if spot is not None else "",
                covers=lasts(balance, on_demand),
                spot_covers=lasts(balance, spot),
            )
        return priced

    def wallet(self, owner: User) -> WalletLine:
        return WalletLine(
            balance=money.shown(ledger.balance(owner)),
            note="Billing is per started minute: a session pays each minute that has begun, the first at once.",
        )

    def per_minute(self, request: SliceRequest, market: str) -> Decimal | None:
        return per_minute(request, market)

    def costs_so_far(self, holdings: Sequence[Slice]) -> dict[int, Decimal]:
        return {slice_id: found.cost for slice_id, found in costs.running_costs(holdings).items()}


def _hourly(rate: Decimal | None) -> str:
    return "—" if rate is None else money.shown(rate * money.MINUTES_PER_HOUR)


class CreditGate:
    """Billing's gate for every slice any workload takes, and every cost one commits to."""

    def refusal(self, owner: User, request: SliceRequest, holder: Holder) -> str | None:
        spot = request.market == Market.SPOT
        return credit.start_refusal(owner, per_minute(request, Market.SPOT if spot else Market.ON_DEMAND), spot)

    def commitment_refusal(self, owner: User, cost: Decimal, what: str) -> str | None:
        return credit.commitment_refusal(owner, cost, what)
