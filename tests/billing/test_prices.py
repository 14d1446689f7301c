"""Prices: the seeded table and its source, the rounding rule, effective dating, and what is refused."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from billing import money, prices
from billing.models import Market, Price
from billing.prices import PriceKey, add_price, in_force
from portal import clock
from portal.clock import database_now
from sessions.gpus import catalog
from sessions.gpus.allocator import allocate, release
from sessions.gpus.holders import Holder
from tests.billing.conftest import A100, Hold

pytestmark = pytest.mark.django_db
A100_WHOLE = PriceKey("A100-SXM4-80GB", "whole", "", Market.ON_DEMAND)


def test_the_seeded_a100_costs_the_seeds_8_50_an_hour_and_spot_60_percent_less(fleet: object) -> None:
    now = database_now()
    assert in_force(A100_WHOLE, now).per_hour == Decimal("8.5")  # type: ignore[union-attr]
    spot = in_force(PriceKey("A100-SXM4-80GB", "whole", "", Market.SPOT), now)
    assert spot is not None and spot.per_hour == Decimal("3.4")
    assert "seeds" in spot.source


def test_every_catalog_model_kind_and_profile_has_a_seeded_price_on_both_markets(fleet: object) -> None:
    now = database_now()
    for model in catalog.models().values():
        keys = [("whole", ""), ("shared", "")] + [("mig", p.name) for p in model.profiles]
        for kind, profile in keys:
            for market in Market.values:
                assert in_force(PriceKey(model.name, kind, profile, market), now) is not None, (model.name, profile)


def test_a_mig_profile_is_priced_by_its_share_of_the_compute_slices(fleet: object) -> None:
    now = database_now()
    whole = in_force(PriceKey("H200-SXM5-141GB", "whole", "", Market.ON_DEMAND), now)
    three = in_force(PriceKey("H200-SXM5-141GB", "mig", "3g.71gb", Market.ON_DEMAND), now)
    assert whole is not None and three is not None
    assert abs(three.per_hour - whole.per_hour * 3 / 7) < Decimal("0.0001")


def test_a_minute_costs_the_hourly_rate_over_60_rounded_half_up_once() -> None:
    assert money.per_minute(Decimal("8.5")) == Decimal("0.141667")
    assert money.per_minute(Decimal("1.2143")) == Decimal("0.020238")
    # 0.0006 / (60 x 4) is exactly 0.0000025: half up gives 3 millionths, where half-even would give 2.
    assert money.per_minute(Decimal("0.0006"), shares=4) == Decimal("0.000003")
    assert money.shown(Decimal("1.555")) == "1.56 CNY"


def test_a_new_price_applies_from_its_moment_on_and_the_old_one_stays_in_the_history(
    fleet: object, staff: User
) -> None:
    now = database_now()
    later = now + timedelta(hours=1)
    added = add_price(A100_WHOLE, "9.25", later, by=staff, source="new contract")
    assert in_force(A100_WHOLE, now).per_hour == Decimal("8.5")  # type: ignore[union-attr]
    assert in_force(A100_WHOLE, later) == added
    assert added.per_minute == Decimal("0.154167") and added.created_by == staff
    assert Price.objects.filter(model_name="A100-SXM4-80GB", kind="whole", market=Market.ON_DEMAND).count() == 2


@pytest.mark.parametrize(
    ("given", "code"),
    [
        ("-1", "negative"),
        ("8.12345", "too_many_decimals"),
        ("eight", "not_a_number"),
        ("NaN", "not_a_number"),
        ("1e9", "absurd"),
    ],
)
def test_a_bad_price_is_refused_with_the_reason(fleet: object, staff: User, given: str, code: str) -> None:
    with pytest.raises(ValidationError) as refused:
        add_price(A100_WHOLE, given, database_now() + timedelta(minutes=5), by=staff)
    assert refused.value.code == code
    assert not Price.objects.filter(created_by=staff).exists()


def test_a_price_for_a_profile_the_model_lacks_is_refused(fleet: object, staff: User) -> None:
    with pytest.raises(ValidationError) as refused:
        add_price(PriceKey("A100-SXM4-80GB", "mig", "3g.71gb", "on_demand"), "1", database_now(), by=staff)
    assert refused.value.code == "unknown_profile"


def test_a_price_from_the_past_that_would_reprice_a_running_holding_is_refused(
    hold: Hold, alice: User, staff: User
) -> None:
    hold(alice, timedelta(minutes=10))
    with pytest.raises(ValidationError) as refused:
        add_price(A100_WHOLE, "20", database_now() - timedelta(hours=1), by=staff)
    assert refused.value.code == "reprices"
    # The same moment for a key nothing has held since is history nobody was billed by: accepted.
    h100 = PriceKey("H100-SXM5-80GB", "whole", "", Market.ON_DEMAND)
    assert add_price(h100, "20", database_now() - timedelta(hours=1), by=staff).per_hour == Decimal(20)


def test_a_price_from_the_past_is_refused_while_a_slice_of_its_kind_allocated_since_is_starting(
    fleet: object, alice: User, staff: User
) -> None:
    """Its launch was quoted the price in force at its allocation, which the past moment would change."""
    starting = allocate(alice, A100, holder=Holder.notebook(4242))
    with pytest.raises(ValidationError) as refused:
        add_price(A100_WHOLE, "20", database_now() - timedelta(hours=1), by=staff)
    assert refused.value.code == "reprices" and "were allocated since" in refused.value.messages[0]
    assert add_price(A100_WHOLE, "20", database_now() + timedelta(seconds=1), by=staff).per_hour == Decimal(20)
    release(starting.pk)


def test_a_price_from_the_very_moment_a_slice_was_allocated_is_refused(fleet: object, alice: User, staff: User) -> None:
    """Found by the property test: with the clock still on the moment of an allocation, a price "from now" would
    have been in force at it, and repriced what the launch had just quoted."""
    now = database_now()
    clock.stop_at(now)
    try:
        starting = allocate(alice, A100, holder=Holder.notebook(4243))
        with pytest.raises(ValidationError) as refused:
            add_price(A100_WHOLE, "20", now, by=staff)
        assert refused.value.code == "reprices"
        assert add_price(A100_WHOLE, "20", now + timedelta(microseconds=1), by=staff).per_hour == Decimal(20)
        release(starting.pk)
    finally:
        clock.stop_at(None)


def test_a_price_is_never_changed_in_place(fleet: object) -> None:
    price = in_force(A100_WHOLE, database_now())
    assert price is not None
    price.per_hour = Decimal(1)
    with pytest.raises(ValidationError):
        price.save()


def test_a_time_sliced_share_and_a_mig_slice_have_their_keys(hold: Hold, alice: User) -> None:
    from tests.billing.conftest import A30_SHARE, H200_3G

    share, mig = hold(alice, timedelta(minutes=1), A30_SHARE), hold(alice, timedelta(minutes=1), H200_3G)
    assert prices.key_of(share, "on_demand") == PriceKey("A30-24GB", "shared", "", "on_demand")
    assert prices.key_of(mig, "spot") == PriceKey("H200-SXM5-141GB", "mig", "3g.71gb", "spot")
