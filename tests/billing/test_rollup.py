"""Folding old minute rows into daily rows: the minute table stays bounded, nothing is charged again,
and a report of past days reads the same before and after. Runs on PostgreSQL and on SQLite."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from billing import ledger, meter, money, rollup
from billing.models import ChargedMinute, Usage, UsageDay
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import allocate
from sessions.gpus.holders import Holder
from tests.billing.conftest import A100, Hold, ledger_total

A100_MINUTE = money.per_minute(Decimal("8.5"))
pytestmark = pytest.mark.django_db


def held_between(owner: User, start: datetime, end: datetime | None, holder_id: int) -> int:
    held = allocate(owner, A100, holder=Holder.notebook(holder_id))
    holdings.started(held.pk, start)
    if end is not None:
        holdings.ended(held.pk, start, end)
    else:
        holdings.seen([held.pk])  # still running: seen so now
    return held.pk


def test_an_ended_usages_minutes_fold_into_days_and_are_never_charged_again(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(days=4), lasted=timedelta(minutes=89, seconds=30))
    assert meter.tick().minutes == 90
    before = ledger.balance(alice)
    folded = rollup.roll_up()
    assert (folded.usages, folded.minutes, folded.amount) == (1, 90, 90 * A100_MINUTE)
    assert not ChargedMinute.objects.filter(usage__slice_id=held.pk).exists()
    days = UsageDay.objects.filter(usage__slice_id=held.pk)
    assert sum(day.minutes for day in days) == 90 and sum(day.amount for day in days) == 90 * A100_MINUTE
    assert meter.tick().minutes == 0 and meter.charge_holding(held.pk).minutes == 0
    assert ledger.balance(alice) == before == -90 * A100_MINUTE and ledger_total() == 0
    assert rollup.roll_up() == rollup.Folded()  # a rerun finds nothing left to fold


def test_running_and_recently_ended_usages_keep_their_minute_rows(hold: Hold, alice: User, bob: User) -> None:
    running = hold(alice, timedelta(days=2))
    recent = hold(bob, timedelta(days=1), lasted=timedelta(minutes=10))
    meter.tick()
    assert rollup.roll_up() == rollup.Folded()
    assert ChargedMinute.objects.filter(usage__slice_id=running.pk).count() == 2 * 1440 + 1
    assert ChargedMinute.objects.filter(usage__slice_id=recent.pk).count() == 10
    assert not Usage.objects.filter(folded=True).exists()


def test_minutes_fold_into_the_utc_day_each_began_on(fleet: object, alice: User) -> None:
    start = datetime.combine(database_now().date() - timedelta(days=10), datetime.min.time(), UTC) - timedelta(
        minutes=1, seconds=30
    )  # 23:58:30: minutes 0 and 1 begin that day, minutes 2 to 4 the next
    held = held_between(alice, start, start + timedelta(minutes=4, seconds=1), 7)
    meter.tick()
    rollup.roll_up()
    days = [(d.day, d.first_minute, d.minutes) for d in UsageDay.objects.filter(usage__slice_id=held)]
    assert days == [(start.date(), 0, 2), (start.date() + timedelta(days=1), 2, 3)]


def test_a_report_of_past_days_is_the_same_before_and_after_the_fold(fleet: object, alice: User, bob: User) -> None:
    today = database_now().date()
    first = datetime.combine(today - timedelta(days=9), datetime.min.time(), UTC) + timedelta(hours=20)
    held_between(alice, first, first + timedelta(hours=7), 1)  # over midnight
    held_between(bob, first + timedelta(days=2), first + timedelta(days=2, minutes=30), 2)
    held_between(bob, database_now() - timedelta(hours=2), None, 3)  # still running: never folded
    meter.tick()
    report: tuple[date, date] = (today - timedelta(days=10), today)
    before = rollup.charged_by_day(*report)
    assert rollup.roll_up().usages == 2
    assert rollup.charged_by_day(*report) == before
    assert before[first.date()] == (240, 240 * A100_MINUTE)
    assert sum(minutes for minutes, _ in before.values()) == 7 * 60 + 30 + 121
    assert sum(amount for _, amount in before.values()) == -ledger.balance(alice) - ledger.balance(bob)


def test_a_usage_missing_minute_rows_is_not_folded(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(days=5), lasted=timedelta(minutes=3))
    meter.tick()
    ChargedMinute.objects.filter(usage__slice_id=held.pk, minute=1).delete()
    with pytest.raises(rollup.RowsMissing):
        rollup.roll_up()
    assert ChargedMinute.objects.filter(usage__slice_id=held.pk).count() == 2 and not UsageDay.objects.exists()
