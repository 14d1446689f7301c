"""Charges settle to the true end, whatever the order of events (issue 30, money 2 and 6).

An open holding is charged up to its last proof of life; once its end is known it has paid exactly the
minutes that began before it: minutes charged past it are given back by a balanced settlement that says why.
Runs on PostgreSQL (the set-based tick) and on SQLite (the loop).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db.models import F

from billing import ledger, meter, money
from billing.models import BilledTotal, ChargedMinute, LedgerTransaction, Market, Usage
from billing.prices import PriceKey, add_price
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.models import Gpu, Slice
from tests.billing.conftest import A30_SHARE, Hold, clock_moves_on, ledger_total, unbalanced_transactions

A100_MINUTE = money.per_minute(Decimal("8.5"))
pytestmark = pytest.mark.django_db


def charged(held_id: int) -> list[int]:
    return list(ChargedMinute.objects.filter(usage__slice_id=held_id).values_list("minute", flat=True))


def assert_balanced() -> None:
    assert ledger_total() == 0 and unbalanced_transactions() == []


def test_minutes_charged_past_a_death_recorded_late_are_given_back_with_a_settlement_that_says_why(
    hold: Hold, alice: User
) -> None:
    """The issue's sequence: start 10:00:00, the container dies 10:02:30, a tick at 10:03:05 charges 4 minutes
    (its proof of life came from a clock ahead of the engine's), the end is recorded at 10:03:20: 3 are paid."""
    held = hold(alice, timedelta(minutes=3, seconds=5))  # seen running "now", 10:03:05
    assert meter.tick().minutes == 4
    assert held.held_from is not None
    holdings.ended(held.pk, held.held_from, held.held_from + timedelta(minutes=2, seconds=30))
    outcome = meter.charge_holding(held.pk)
    assert (outcome.minutes, outcome.settled, outcome.given_back) == (0, 1, A100_MINUTE)
    assert charged(held.pk) == [0, 1, 2]
    assert ledger.balance(alice) == -3 * A100_MINUTE
    settlement = LedgerTransaction.objects.get(kind=LedgerTransaction.Kind.SETTLEMENT)
    assert settlement.user == alice
    assert "1 minute charged after Notebook session #" in settlement.memo and "given back" in settlement.memo
    usage = Usage.objects.get(slice=held)
    assert (usage.billed_minutes, usage.open, usage.ended) == (3, False, held.held_from + timedelta(seconds=150))
    assert BilledTotal.objects.get(model_name="A100-SXM4-80GB", market=Market.ON_DEMAND).minutes == 3
    clock_moves_on(5)
    assert meter.tick().minutes == 0 and ledger.balance(alice) == -3 * A100_MINUTE  # settled once, for good
    assert_balanced()


def test_a_holding_nobody_can_confirm_is_not_charged_past_its_last_proof_of_life(hold: Hold, alice: User) -> None:
    """The engine cannot be reached for ten minutes: nothing proves the container ran, so nothing is charged."""
    held = hold(alice, timedelta(minutes=1, seconds=30))
    assert meter.tick().minutes == 2
    clock_moves_on(10, seen=False)
    assert meter.tick().minutes == 0
    assert charged(held.pk) == [0, 1]


def test_an_outage_s_minutes_are_charged_once_the_container_is_confirmed_running_again(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=1, seconds=30))
    meter.tick()
    clock_moves_on(10, seen=False)
    meter.tick()
    holdings.seen([held.pk])  # the engine answers again: the same container still runs
    assert meter.tick().minutes == 10
    assert charged(held.pk) == list(range(12))
    assert_balanced()


def test_a_holding_that_ended_during_the_outage_is_charged_to_its_end_once_it_is_known(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=1, seconds=30))
    meter.tick()
    clock_moves_on(10, seen=False)
    held.refresh_from_db()
    assert held.held_from is not None
    holdings.ended(held.pk, held.held_from, held.held_from + timedelta(minutes=6, seconds=1))
    assert meter.charge_holding(held.pk).minutes == 5
    assert charged(held.pk) == list(range(7)) and ledger.balance(alice) == -7 * A100_MINUTE


def test_an_end_without_a_moment_ends_the_holding_at_its_last_proof_of_life(hold: Hold, alice: User) -> None:
    """The engine lost the container and its events: the end falls at the last proof, never at the moment the
    portal noticed."""
    held = hold(alice, timedelta(minutes=2, seconds=10))
    seen_at = Slice.objects.get(pk=held.pk).seen_at
    clock_moves_on(7, seen=False)
    holdings.end(held.pk, None, "its container is gone")
    held.refresh_from_db()
    assert seen_at is not None and held.held_until == seen_at - timedelta(minutes=7)
    assert held.released_at is not None
    meter.charge_holding(held.pk)
    assert charged(held.pk) == [0, 1, 2]


def test_a_time_sliced_share_pays_the_share_count_its_slice_was_allocated_with(
    hold: Hold, alice: User, staff: User
) -> None:
    """Staff change the GPU's share count after the slice was allocated, before the meter first sees it: the
    holding pays 1/N of the N it was quoted."""
    share = hold(alice, timedelta(seconds=5), A30_SHARE)
    Gpu.objects.filter(pk=share.gpu_id).update(share_limit=8)
    meter.tick()
    usage = Usage.objects.get(slice=share)
    assert usage.shares == 3
    assert usage.per_minute == money.per_minute(usage.price.per_hour, shares=3)


def test_a_price_that_takes_effect_between_allocation_and_container_start_does_not_apply(
    hold: Hold, alice: User, staff: User
) -> None:
    """The launch quoted the price of its allocation; a price added for later, which was in force by the time
    the container started, is not what the holding pays."""
    key = PriceKey("A100-SXM4-80GB", "whole", "", Market.ON_DEMAND)
    add_price(key, "600", database_now() + timedelta(seconds=30), by=staff)
    held = hold(alice, -timedelta(seconds=40))  # its container starts 40 s after its allocation
    Slice.objects.filter(pk=held.pk).update(allocated_at=database_now() - timedelta(seconds=1))
    clock_moves_on(1)
    meter.tick()
    assert Usage.objects.get(slice=held).per_minute == A100_MINUTE


def test_a_proof_of_life_never_moves_back_nor_touches_an_ended_holding(hold: Hold, alice: User) -> None:
    running = hold(alice, timedelta(minutes=1))
    ended = hold(alice, timedelta(minutes=3), lasted=timedelta(minutes=1))
    before = {row.pk: row.seen_at for row in Slice.objects.filter(pk__in=[running.pk, ended.pk])}
    later = database_now() - timedelta(minutes=5)
    assert holdings.seen([running.pk, ended.pk], at=later) == 1
    after = {row.pk: row.seen_at for row in Slice.objects.filter(pk__in=[running.pk, ended.pk])}
    assert after == before


def test_settlements_and_charges_keep_the_minute_rows_contiguous_from_the_first(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=9, seconds=59))
    meter.tick()
    assert held.held_from is not None
    Slice.objects.filter(pk=held.pk).update(held_until=F("held_from") + timedelta(minutes=4))
    meter.tick()
    usage = Usage.objects.get(slice=held)
    assert charged(held.pk) == list(range(usage.billed_minutes)) == [0, 1, 2, 3]
    assert_balanced()
