"""Keeping the minute rows bounded: an ended usage's minutes fold into one row per UTC day.

The tick writes a row per running usage per minute (about 144 million a day at 100,000 usages). Once
a usage has ended PORTAL_BILLING_MINUTE_DAYS ago, a daily task replaces its minute rows by ``UsageDay``
rows (minutes, first minute, amount per day the minutes began on), so the minute table holds only
the running usages and the last few days, and a report of a past month reads that month's daily
rows. Folding can never lead to a minute being charged again: only ended usages are folded, and the
meter charges open usages only, from their ``billed_minutes`` on. A rerun finds nothing left to fold.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum

from billing import money
from billing.models import ChargedMinute, Usage, UsageDay
from portal.clock import database_now

BATCH = 500  # usages per transaction: at most a day of minutes each, so a few hundred thousand rows
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)


@dataclass(frozen=True)
class Folded:
    usages: int = 0
    minutes: int = 0
    days: int = 0
    amount: Decimal = Decimal(0)


class RowsMissing(RuntimeError):
    """A usage's minute rows are not exactly the minutes it was charged: nothing is folded."""


def kept_days() -> int:
    return int(settings.BILLING_MINUTE_DAYS)


def roll_up(older_than: timedelta | None = None) -> Folded:
    """Fold the minute rows of every usage that ended more than ``older_than`` ago (default: the setting)."""
    cutoff = database_now() - (older_than if older_than is not None else timedelta(days=kept_days()))
    total = Folded()
    while True:
        with transaction.atomic():
            batch = list(
                Usage.objects.select_for_update(skip_locked=True)
                .filter(open=False, folded=False, ended__lt=cutoff)
                .order_by("ended")[:BATCH]
            )
            if not batch:
                return total
            done = _fold(batch)
        total = Folded(
            total.usages + done.usages, total.minutes + done.minutes, total.days + done.days, total.amount + done.amount
        )


def _fold(usages: list[Usage]) -> Folded:
    days = [day for usage in usages for day in usage_days(usage)]
    removed, _ = ChargedMinute.objects.filter(usage__in=usages).delete()
    expected = sum(usage.billed_minutes for usage in usages)
    if removed != expected:  # the unique key and the meter's range make count equality mean the same rows
        raise RowsMissing(f"{removed} minute rows for {expected} charged minutes of usages {[u.pk for u in usages]}")
    UsageDay.objects.bulk_create(days)
    Usage.objects.filter(pk__in=[usage.pk for usage in usages]).update(folded=True)
    return Folded(len(usages), removed, len(days), sum((day.amount for day in days), Decimal(0)))


def usage_days(usage: Usage) -> list[UsageDay]:
    """A usage's charged minutes (0 .. billed_minutes - 1) grouped by the UTC day each began on."""
    rows, minute = [], 0
    while minute < usage.billed_minutes:
        began = usage.started + minute * MINUTE
        next_day = datetime.combine(began.astimezone(UTC).date() + DAY, time(), UTC)
        upto = min(usage.billed_minutes, -(-(next_day - usage.started) // MINUTE))
        count = upto - minute
        rows.append(
            UsageDay(
                usage=usage,
                day=began.astimezone(UTC).date(),
                first_minute=minute,
                minutes=count,
                amount=usage.per_minute * count,
            )
        )
        minute = upto
    return rows


def charged_by_day(first: date, last: date) -> dict[date, tuple[int, Decimal]]:
    """Minutes charged and their amount per UTC day from ``first`` to ``last``: the folded days from their
    index, the rest from the usages not folded yet (running, or ended in the last few days)."""
    totals: dict[date, list[int | Decimal]] = defaultdict(lambda: [0, Decimal(0)])
    folded = (
        UsageDay.objects.filter(day__gte=first, day__lte=last)
        .values("day")
        .annotate(minutes=Sum("minutes"), amount=Sum("amount"))
    )
    for row in folded:
        totals[row["day"]][0] += row["minutes"]
        totals[row["day"]][1] += money.exact(row["amount"])
    since = datetime.combine(first, time(), UTC)
    until = datetime.combine(last + DAY, time(), UTC)
    recent = Usage.objects.filter(Q(open=True) | Q(open=False, folded=False), started__lt=until).exclude(
        ended__lt=since
    )
    for usage in recent.filter(billed_minutes__gt=0):
        for day in usage_days(usage):
            if first <= day.day <= last:
                totals[day.day][0] += day.minutes
                totals[day.day][1] += day.amount
    return {day: (int(minutes), Decimal(amount)) for day, (minutes, amount) in sorted(totals.items())}
