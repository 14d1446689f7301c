"""The zero-balance warning and budget alerts reach the person's open pages over the websocket, and
nobody else's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from billing import budgets, credit, meter
from tests.billing.conftest import Hold
from tests.helpers.websockets import open_socket

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_zero_balance_warning_is_pushed_to_its_owner_only(hold: Hold, alice: User, bob: User) -> None:
    alice_socket, _, _ = await open_socket("/ws/notifications/", alice)
    bob_socket, _, _ = await open_socket("/ws/notifications/", bob)
    await database_sync_to_async(hold)(alice, timedelta(seconds=20))
    counts = await database_sync_to_async(credit.check_balances)()
    assert counts["warned"] == 1
    message = await alice_socket.receive_json_from(timeout=5)
    assert message["type"] == "billing.zero_balance" and "will be stopped at" in message["text"]
    assert await bob_socket.receive_nothing(timeout=0.5)
    await alice_socket.disconnect()
    await bob_socket.disconnect()


async def test_a_budget_alert_is_pushed_once(hold: Hold, alice: User) -> None:
    await database_sync_to_async(budgets.set_budget)("0.20", by=alice, user=alice)
    await database_sync_to_async(hold)(alice, timedelta(minutes=1), lasted=timedelta(seconds=90))  # 0.28: 100 %
    await database_sync_to_async(meter.tick)()
    socket, _, _ = await open_socket("/ws/notifications/", alice)
    assert await database_sync_to_async(budgets.check_budgets)() == 3
    thresholds = [(await socket.receive_json_from(timeout=5))["threshold"] for _ in range(3)]
    assert thresholds == [50, 80, 100]
    assert await database_sync_to_async(budgets.check_budgets)() == 0
    assert await socket.receive_nothing(timeout=0.5)
    await socket.disconnect()
