"""The finance figures: what was billed over a range of UTC days, by day, person, group, GPU model,
profile and market; the fleet's GPU-hours; idle spend; negative balances.

Every figure is aggregated in SQL from the two places charged minutes live (billing/rollup.py): the
minute rows of usages not folded yet, each on the UTC day it began, and the daily rows of folded
ones. A minute's day is computed by the database (``MinuteDay``), so no report loops over usages.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import (
    Count,
    DateField,
    DateTimeField,
    DecimalField,
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce, Least, TruncMinute

from billing import money
from billing.models import Account, ChargedMinute, Entry, Usage, UsageDay
from sessions.gpus import catalog, holders
from sessions.gpus.models import Gpu, Slice
from sessions.metrics.models import GpuMinute

DAY = timedelta(days=1)
AMOUNT: Any = DecimalField(max_digits=18, decimal_places=6)
# What a report groups by, as a path from a usage.
KEYS = {
    "usage": "id",
    "user": "owner_id",
    "username": "owner__username",
    "group": "owner__groups__name",
    "model": "slice__gpu__model_name",
    "kind": "slice__kind",
    "profile": "slice__profile",
    "market": "market",
    "compute_slices": "slice__compute_slices",
    "shares": "shares",
}


class MinuteDay(Func):
    """The UTC day minute ``minute`` of a usage began on: ``started + minute minutes``, as a date."""

    output_field = DateField()

    template = "((%(expressions)s * interval '1 minute') AT TIME ZONE 'UTC')::date"  # PostgreSQL
    arg_joiner = " + "

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return super().as_sql(
            compiler, connection, template="date(%(expressions)s || ' minutes')", arg_joiner=", '+' || ", **extra
        )


class MinuteStart(Func):
    """When minute ``minute`` of a usage began: ``started + minute minutes`` (on SQLite to the second,
    which is all a comparison with a history minute needs)."""

    output_field = DateTimeField()
    template = "(%(expressions)s * interval '1 minute')"  # PostgreSQL
    arg_joiner = " + "

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return super().as_sql(
            compiler, connection, template="datetime(%(expressions)s || ' minutes')", arg_joiner=", '+' || ", **extra
        )


@dataclass(frozen=True)
class Scope:
    """UTC days ``first`` to ``last`` and, for a drill-down, what the figure was of."""

    first: date
    last: date
    user: int | None = None
    group: str | None = None  # "" for people in no group
    model: str = ""
    kind: str = ""
    profile: str = ""
    market: str = ""
    usage: int | None = None

    @property
    def since(self) -> datetime:
        return datetime.combine(self.first, time(), UTC)

    @property
    def until(self) -> datetime:
        return datetime.combine(self.last + DAY, time(), UTC)

    def day(self, day: date) -> Scope:
        return replace(self, first=day, last=day)

    def usages(self, prefix: str = "") -> Q:
        """The usages a figure of this scope may include, as a filter from ``prefix`` (e.g. ``usage__``)."""
        wanted: dict[str, Any] = {"user": self.user, "model": self.model, "kind": self.kind, "market": self.market}
        wanted |= {"usage": self.usage, "profile": self.profile}
        q = Q(**{prefix + KEYS[key]: value for key, value in wanted.items() if value not in (None, "")})
        if self.group == "":
            q &= Q(**{prefix + "owner__groups__isnull": True})
        elif self.group is not None:
            q &= Q(**{prefix + KEYS["group"]: self.group})
        overlaps = Q(**{prefix + "started__lt": self.until}) & (
            Q(**{prefix + "ended__isnull": True}) | Q(**{prefix + "ended__gte": self.since})
        )
        return q & overlaps


def minute_rows(scope: Scope) -> QuerySet[ChargedMinute]:
    """Charged minute rows (of usages not folded yet) that began within the scope's days."""
    return (
        ChargedMinute.objects.filter(scope.usages("usage__"))
        .annotate(day=MinuteDay(F("usage__started"), F("minute")))
        .filter(day__gte=scope.first, day__lte=scope.last)
    )


def day_rows(scope: Scope) -> QuerySet[UsageDay]:
    return UsageDay.objects.filter(scope.usages("usage__"), day__gte=scope.first, day__lte=scope.last)


def billed(scope: Scope, keys: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Minutes and amount billed in the scope, per combination of ``keys`` (``day`` or a name in KEYS)."""
    paths = ["day" if key == "day" else "usage__" + KEYS[key] for key in keys]
    per: dict[tuple[Any, ...], list[Any]] = defaultdict(lambda: [0, Decimal(0)])
    from_minutes = minute_rows(scope).values(*paths).annotate(minutes=Count("pk"), amount=Sum("usage__per_minute"))
    from_days = day_rows(scope).values(*paths).annotate(minutes=Sum("minutes"), amount=Sum("amount"))
    for rows in (from_minutes.order_by(), from_days.order_by()) if paths else ():
        for row in rows:
            total = per[tuple(row[path] for path in paths)]
            total[0] += row["minutes"]
            total[1] += row["amount"]
    if not paths:  # one total: aggregate, since values() of no field would group by every field
        for rows in (
            minute_rows(scope).aggregate(minutes=Count("pk"), amount=Sum("usage__per_minute")),
            day_rows(scope).aggregate(minutes=Sum("minutes"), amount=Sum("amount")),
        ):
            per[()][0] += rows["minutes"] or 0
            per[()][1] += rows["amount"] or Decimal(0)
    return [
        {**dict(zip(keys, key, strict=True)), "minutes": int(minutes), "amount": money.exact(amount)}
        for key, (minutes, amount) in per.items()
    ]


def total(scope: Scope) -> dict[str, Any]:
    return billed(scope)[0]


def by(scope: Scope, keys: Sequence[str], order: str = "-amount") -> list[dict[str, Any]]:
    """``billed`` sorted by amount (largest first) or by the first key."""
    rows = billed(scope, keys)
    if order == "-amount":
        return sorted(rows, key=lambda row: (-row["amount"], [str(row[key]) for key in keys]))
    return sorted(rows, key=lambda row: [str(row[key]) for key in keys])


def revenue_per_day(scope: Scope) -> list[dict[str, Any]]:
    """Every day of the range, a day with nothing billed as zero (a chart needs the gaps)."""
    found = {row["day"]: row for row in billed(scope, ["day"])}
    days = [scope.first + DAY * n for n in range((scope.last - scope.first).days + 1)]
    return [found.get(day, {"day": day, "minutes": 0, "amount": Decimal(0)}) for day in days]


def idle_minutes(threshold: float) -> QuerySet[GpuMinute]:
    """For the usage outside (annotated with ``started_minute`` and ``last_began``): the history minutes
    its charged minutes began in (charged minute k: the one ``started + k`` falls in), in which its
    device's utilisation stayed under ``threshold`` all minute (the minute's max under it; a minute that
    reported nothing is not idle). The usage's page marks the same minutes idle, one by one."""
    return GpuMinute.objects.filter(
        device_uuid=OuterRef("slice__device_uuid"),
        holder=holders.as_text(OuterRef("holder_kind"), OuterRef("holder_id")),
        util_max__lt=threshold,
        minute__gte=OuterRef("started_minute"),
        minute__lte=OuterRef("last_began"),
    )


def idle_spend(scope: Scope, keys: Sequence[str] = ("user", "username")) -> list[dict[str, Any]]:
    """Money billed for idle minutes in the scope, per ``keys``: a usage's charged minutes whose history
    minute (within the scope's days) was quiet, each at its frozen per-minute rate."""
    quiet = idle_minutes(float(settings.IDLE_GPU_UTIL_PERCENT)).filter(minute__gte=scope.since, minute__lt=scope.until)
    count = quiet.order_by().values("device_uuid").annotate(n=Count("pk")).values("n")
    idle = Least(Coalesce(Subquery(count), 0), F("billed_minutes"), output_field=IntegerField())
    paths = [KEYS[key] for key in keys]
    rows = (
        Usage.objects.filter(scope.usages())
        .annotate(started_minute=TruncMinute("started"), last_began=MinuteStart(F("started"), F("billed_minutes") - 1))
        .annotate(idle=idle)
        .filter(idle__gt=0)
        .values(*paths)
        .annotate(idle_minutes=Sum("idle"), idle_amount=Sum(F("idle") * F("per_minute"), output_field=AMOUNT))
        .order_by("-idle_amount", *paths)
    )
    return [{**{key: row[path] for key, path in zip(keys, paths, strict=True)}, **_figures(row)} for row in rows]


def _figures(row: dict[str, Any]) -> dict[str, Any]:
    return {"minutes": row["idle_minutes"], "amount": money.exact(row["idle_amount"])}


def idle_total(scope: Scope) -> dict[str, Any]:
    rows = idle_spend(scope, ["market"])
    return {
        "minutes": sum(row["minutes"] for row in rows),
        "amount": sum((row["amount"] for row in rows), Decimal(0)),
    }


def _gpu_share(model: str, kind: str, compute_slices: int, shares: int) -> Decimal:
    """How much of one GPU a slice is: a whole GPU 1, a MIG slice its compute slices' share, a time-sliced
    share 1/N."""
    if kind == Slice.Kind.MIG:
        try:
            of = catalog.model(model).compute_slices
        except Exception:  # a model the catalog lost: count the slice as a whole GPU rather than hide it
            of = 0
        return Decimal(compute_slices) / of if of else Decimal(1)
    if kind == Slice.Kind.SHARED:
        return Decimal(1) / max(shares, 1)
    return Decimal(1)


def fleet_utilisation(scope: Scope, now: datetime) -> list[dict[str, Any]]:
    """Per GPU model: GPU-hours billed (a slice counts by its share of a GPU) against the GPU-hours the
    fleet of today had in the range (up to now)."""
    hours = max(Decimal(0), Decimal((min(scope.until, now) - scope.since).total_seconds()) / 3600)
    gpus = dict(Gpu.objects.values("model_name").annotate(n=Count("pk")).values_list("model_name", "n"))
    used: dict[str, Decimal] = defaultdict(Decimal)
    for row in billed(scope, ["model", "kind", "compute_slices", "shares"]):
        share = _gpu_share(row["model"], row["kind"], row["compute_slices"], row["shares"])
        used[row["model"]] += share * row["minutes"] / 60
    rows = []
    for model in sorted(set(gpus) | set(used)):
        available = hours * gpus.get(model, 0)
        billed_hours = used.get(model, Decimal(0))
        rows.append(
            {
                "model": model,
                "gpus": gpus.get(model, 0),
                "billed_hours": billed_hours.quantize(Decimal("0.01")),
                "available_hours": available.quantize(Decimal("0.01")),
                "percent": (100 * billed_hours / available).quantize(Decimal("0.1")) if available else None,
            }
        )
    return rows


def negative_balances() -> list[dict[str, Any]]:
    """Wallets below zero now, the lowest first."""
    rows = (
        Entry.objects.filter(account__kind=Account.Kind.WALLET)
        .values("account__user_id", "account__user__username")
        .annotate(balance=Sum("amount"))
        .filter(balance__lt=0)
        .order_by("balance")
    )
    return [
        {"user": r["account__user_id"], "username": r["account__user__username"], "balance": money.exact(r["balance"])}
        for r in rows
    ]
