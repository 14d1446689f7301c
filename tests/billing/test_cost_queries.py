"""The cost so far of many holdings at once takes a fixed number of queries: the session cards, the billing
page's running list and history, and the dashboard's credit card ask the same for 2 sessions as for 8."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from billing import ledger, meter, money
from billing.prices import database_now
from sessions.gpus.allocator import holding_started
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.billing.conftest import A100
from tests.factories import running_session

pytestmark = pytest.mark.django_db
SIZES = [2, 8]
# Measured, the same at both sizes; a query per session would put the larger size over.
SESSION_CARDS_QUERIES = 10  # the cards alone, as they poll
SESSION_PAGE_QUERIES = 54  # with the launch form's offers and prices (per offer, not per session)
BILLING_PAGE_QUERIES = 22
DASHBOARD_QUERIES = 13


@pytest.fixture
def sessions_of_alice(fleet: object, alice: User) -> Callable[[int], list[NotebookSession]]:
    """``count`` running sessions of alice's on A100s; the first half opened by a meter tick, the rest not yet
    (their rate comes from the prices, theirs from the usage)."""
    image, _ = NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "x"})

    def make(count: int) -> list[NotebookSession]:
        found = []
        for index in range(count):
            session = running_session(alice, image, A100, f"lab-{index}")
            assert session.slice_id is not None
            holding_started(session.slice_id, database_now() - timedelta(minutes=index + 1))
            found.append(session)
            if index == count // 2 - 1:
                meter.tick()
        return found

    return make


@pytest.mark.parametrize("count", SIZES)
def test_the_session_cards_costs_take_the_same_queries_for_any_number_of_sessions(
    sessions_of_alice: Callable[[int], list[NotebookSession]],
    alice_client: Client,
    count: int,
    django_assert_max_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    sessions_of_alice(count)
    with django_assert_max_num_queries(SESSION_CARDS_QUERIES):
        cards = alice_client.get(reverse("session-list"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="session-cards")
    assert cards.content.decode().count('data-testid="cost"') == count
    with django_assert_max_num_queries(SESSION_PAGE_QUERIES):
        page = alice_client.get(reverse("session-list"))
    assert page.content.decode().count('data-testid="cost"') == count


@pytest.mark.parametrize("count", SIZES)
def test_the_billing_page_takes_the_same_queries_for_any_number_of_running_usages(
    sessions_of_alice: Callable[[int], list[NotebookSession]],
    alice_client: Client,
    count: int,
    django_assert_max_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    sessions_of_alice(count)
    with django_assert_max_num_queries(BILLING_PAGE_QUERIES):
        page = alice_client.get(reverse("billing-account")).content.decode()
    assert page.count('data-testid="cost"') == count and page.count('data-testid="usage-row"') == count


@pytest.mark.parametrize("count", SIZES)
def test_the_dashboard_takes_the_same_queries_for_any_number_of_running_usages(
    sessions_of_alice: Callable[[int], list[NotebookSession]],
    alice: User,
    staff: User,
    alice_client: Client,
    count: int,
    django_assert_max_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    ledger.grant_credit(alice, "100", by=staff, reason="course")
    sessions_of_alice(count)
    with django_assert_max_num_queries(DASHBOARD_QUERIES):
        page = alice_client.get(reverse("dashboard")).content.decode()
    assert f"burning {money.shown(count * money.per_minute(Decimal('8.5')) * 60)}/h" in page
