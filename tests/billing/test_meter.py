"""The meter over a controlled clock: each started minute of each holding charged once, from the
recorded moments; outages caught up; the end charged at once; frozen rates; ticks at once.

Runs on PostgreSQL (set-based SQL) and on SQLite (the loop): the same figures on both.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from billing import ledger, meter, money
from billing.models import Account, ChargedMinute, Market, Usage
from billing.prices import PriceKey, add_price
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import release
from tests.billing.conftest import (
    A30_SHARE,
    H200_3G,
    Hold,
    clock_moves_on,
    end_holding,
    ledger_total,
    unbalanced_transactions,
)

A100_MINUTE = money.per_minute(Decimal("8.5"))  # 0.141667
postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's set-based tick")


def charged(held_id: int) -> list[int]:
    return list(ChargedMinute.objects.filter(usage__slice_id=held_id).values_list("minute", flat=True))


def assert_balanced() -> None:
    assert ledger_total() == 0 and unbalanced_transactions() == []


@pytest.mark.django_db
def test_a_running_holding_is_charged_for_every_started_minute(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=10, seconds=30))
    outcome = meter.tick()
    assert (outcome.minutes, outcome.usages_opened, outcome.transactions) == (11, 1, 1)
    assert charged(held.pk) == list(range(11))
    assert ledger.balance(alice) == -11 * A100_MINUTE
    assert ledger.account_balance(Account.Kind.REVENUE_ON_DEMAND) == 11 * A100_MINUTE
    usage = Usage.objects.get(slice=held)
    assert (usage.billed_minutes, usage.open, usage.started) == (11, True, held.held_from)
    assert_balanced()


@pytest.mark.django_db
def test_a_second_tick_charges_nothing_more(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(minutes=3, seconds=20))
    meter.tick()
    again = meter.tick()
    assert (again.minutes, again.transactions) == (0, 0)
    assert ChargedMinute.objects.count() == 4 and ledger.balance(alice) == -4 * A100_MINUTE


@pytest.mark.django_db
def test_a_ten_minute_outage_is_caught_up_by_the_next_tick_none_twice(hold: Hold, alice: User, bob: User) -> None:
    first, second = hold(alice, timedelta(seconds=20)), hold(bob, timedelta(minutes=2, seconds=20))
    assert meter.tick().minutes == 1 + 3
    clock_moves_on(10)  # worker and beat down for ten minutes
    outcome = meter.tick()
    assert (outcome.minutes, outcome.transactions) == (20, 2)  # one ledger transaction per person per tick
    assert charged(first.pk) == list(range(11)) and charged(second.pk) == list(range(13))
    assert ledger.balance(alice) == -11 * A100_MINUTE and ledger.balance(bob) == -13 * A100_MINUTE
    assert_balanced()


@pytest.mark.django_db
def test_the_end_of_a_holding_charges_its_last_partial_minute_at_once(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=3, seconds=30))
    assert meter.tick().minutes == 4
    clock_moves_on(2)
    end_holding(held, timedelta(minutes=5, seconds=10))  # minute 5 began 10 s before the end: it is due
    outcome = meter.charge_holding(held.pk)
    assert outcome.minutes == 2 and charged(held.pk) == list(range(6))
    usage = Usage.objects.get(slice=held)
    assert held.held_from is not None
    assert usage.open is False and usage.ended == held.held_from + timedelta(minutes=5, seconds=10)
    clock_moves_on(30)
    assert meter.tick().minutes == 0  # an ended usage is never charged again
    assert ledger.balance(alice) == -6 * A100_MINUTE
    assert_balanced()


@pytest.mark.django_db
def test_a_holding_that_ended_between_ticks_is_charged_to_its_end(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=8), lasted=timedelta(minutes=2))
    release(held.pk)
    assert meter.tick().minutes == 2
    assert charged(held.pk) == [0, 1] and not Usage.objects.get(slice=held).open


@pytest.mark.django_db
def test_a_holding_that_ends_on_its_first_moment_pays_its_first_minute(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=1), lasted=timedelta(0))
    assert meter.charge_holding(held.pk).minutes == 1


@pytest.mark.django_db
def test_a_released_slice_with_no_recorded_end_ended_at_its_release(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=1, seconds=30))
    release(held.pk)
    clock_moves_on(5)
    assert meter.tick().minutes == 2
    assert not Usage.objects.get(slice=held).open


@pytest.mark.django_db
def test_a_usage_whose_end_moment_is_before_its_start_ends_at_its_start_and_pays_its_first_minute(
    hold: Hold, alice: User
) -> None:
    """Docker's moments against the database's: an end reported before the start (a clock behind), and a
    release the database stamped before a start Docker's clock put ahead of it."""
    reported = hold(alice, timedelta(minutes=3))
    assert reported.held_from is not None
    holdings.ended(reported.pk, reported.held_from, reported.held_from - timedelta(minutes=2))
    released = hold(alice, -timedelta(seconds=40))  # its start 40 s ahead of the database's now
    release(released.pk)  # released now, by the database's clock: before that start
    outcome = meter.tick()
    assert outcome.minutes == 2 and charged(reported.pk) == [0] and charged(released.pk) == [0]
    for held in (reported, released):
        usage = Usage.objects.get(slice=held)
        assert usage.ended == usage.started and not usage.open
    assert ledger.balance(alice) == -2 * A100_MINUTE
    with pytest.raises(IntegrityError), transaction.atomic():  # and the database refuses it outright
        Usage.objects.filter(slice=reported).update(ended=F("started") - timedelta(seconds=1))
    assert_balanced()


@pytest.mark.django_db
def test_a_holding_the_database_clock_has_not_reached_is_charged_nothing_yet(hold: Hold, alice: User) -> None:
    """Docker's clock ahead of the database's: the meter goes by the database's."""
    hold(alice, -timedelta(seconds=30))
    assert meter.tick().minutes == 0
    clock_moves_on(1)
    assert meter.tick().minutes == 1


@pytest.mark.django_db
def test_a_price_change_mid_holding_does_not_touch_it(hold: Hold, alice: User, bob: User, staff: User) -> None:
    held = hold(alice, timedelta(minutes=4, seconds=30))
    meter.tick()
    add_price(PriceKey("A100-SXM4-80GB", "whole", "", Market.ON_DEMAND), "60", database_now(), by=staff)
    clock_moves_on(5)
    later = hold(bob, timedelta(seconds=10))
    meter.tick()
    assert Usage.objects.get(slice=held).per_minute == A100_MINUTE
    assert ledger.balance(alice) == -10 * A100_MINUTE
    assert Usage.objects.get(slice=later).per_minute == Decimal(1) and ledger.balance(bob) == -1


@pytest.mark.django_db
def test_mig_and_time_sliced_rates_follow_the_rounding_rule(hold: Hold, alice: User) -> None:
    mig, share = hold(alice, timedelta(seconds=5), H200_3G), hold(alice, timedelta(seconds=5), A30_SHARE)
    meter.tick()
    mig_usage, share_usage = Usage.objects.get(slice=mig), Usage.objects.get(slice=share)
    assert mig_usage.price.profile == "3g.71gb" and mig_usage.per_minute == money.per_minute(mig_usage.price.per_hour)
    assert share_usage.shares == 3
    assert share_usage.per_minute == money.per_minute(share_usage.price.per_hour, shares=3)
    assert ledger.balance(alice) == -(mig_usage.per_minute + share_usage.per_minute)


@postgresql_only
@pytest.mark.django_db
def test_the_ticks_queries_do_not_grow_with_the_number_of_usages(hold: Hold, alice: User, bob: User) -> None:
    hold(alice, timedelta(minutes=2))
    with CaptureQueriesContext(connection) as one:
        meter.tick()
    for owner in (alice, bob, alice, bob, alice):
        hold(owner, timedelta(minutes=3))
    clock_moves_on(1)
    with CaptureQueriesContext(connection) as six:
        outcome = meter.tick()
    assert outcome.usages_opened == 5 and outcome.transactions == 2
    assert len(one.captured_queries) == len(six.captured_queries) <= 8


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_tick_while_another_holds_the_meter_returns_at_once_and_charges_nothing(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(minutes=5))
    holding, done, waited = threading.Event(), threading.Event(), threading.Event()

    def other_tick() -> None:
        """Holds the meter's lock and watches for anyone queueing behind it until the tick has returned."""
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [meter.LOCK_KEY])
                holding.set()
                for _ in range(600):  # 30 s at most
                    cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)")
                    if cursor.fetchone()[0]:
                        waited.set()
                    if done.wait(0.05):
                        break
        finally:
            connection.close()

    thread = threading.Thread(target=other_tick)
    thread.start()
    assert holding.wait(30)
    outcome = meter.tick()
    done.set()
    thread.join()
    # It gave up at once: it never queued for the lock (a queued tick would show as an advisory lock not granted).
    assert outcome.skipped and not waited.is_set()
    assert ChargedMinute.objects.count() == 0
    assert meter.tick().minutes == 6


@pytest.mark.django_db(transaction=True)
def test_ticks_at_once_on_several_connections_charge_each_minute_once(hold: Hold, alice: User, bob: User) -> None:
    hold(alice, timedelta(minutes=6, seconds=30))
    hold(bob, timedelta(minutes=2, seconds=30))
    start = threading.Barrier(4)
    outcomes: list[meter.Outcome] = []

    def run() -> None:
        try:
            start.wait(30)
            outcomes.append(meter.tick())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 4 and sum(o.minutes for o in outcomes) == 7 + 3
    assert ChargedMinute.objects.count() == 10
    assert ledger.balance(alice) == -7 * A100_MINUTE and ledger.balance(bob) == -3 * A100_MINUTE
    assert_balanced()
