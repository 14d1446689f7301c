"""The market a holding is billed on is the one its slice was allocated on (Slice.market), on both meters."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.models import User

from billing import ledger, meter
from billing.models import Account, Market, Usage
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Gpu
from tests.billing.conftest import A100, Hold

A100_SPOT = SliceRequest(kind="whole", model="A100-80GB", market="spot")
A100_SPOT_MINUTE = Decimal("0.056667")  # 3.40 CNY/h, the seeds' A100 at 60 % off


def test_a_spot_slice_is_charged_at_the_spot_rate_to_spot_revenue(
    fleet: list[Gpu], hold: Hold, alice: User, bob: User
) -> None:
    spot = hold(alice, timedelta(minutes=2, seconds=30), A100_SPOT)
    on_demand = hold(bob, timedelta(minutes=2, seconds=30), A100)
    meter.tick()
    assert Usage.objects.get(slice=spot).market == Market.SPOT
    assert Usage.objects.get(slice=on_demand).market == Market.ON_DEMAND
    assert ledger.balance(alice) == -3 * A100_SPOT_MINUTE
    assert ledger.account_balance(Account.Kind.REVENUE_SPOT) == 3 * A100_SPOT_MINUTE
