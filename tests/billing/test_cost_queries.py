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
from billing.launch import BillingPricing
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.offers import offers
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.billing.conftest import A100
from tests.factories import running_session
from tests.gpus.conftest import use_fleet

pytestmark = pytest.mark.django_db
SIZES = [2, 8]
# Measured, the same at both sizes; a query per session would put the larger size over.
SESSION_CARDS_QUERIES = 13  # the cards alone, as they poll: 3 of them the person's storage quota and use
SESSION_PAGE_QUERIES = 22  # with the launch form: its offers (per GPU) and their prices (4, whatever the offers)
BILLING_PAGE_QUERIES = 23  # with what came into the wallet besides charges (credit, minutes given back)
DASHBOARD_QUERIES = 14  # with the count of the person's queued and rendering render jobs
# The launch form's prices: the database's clock, the prices in force then, the time-sliced models' share
# limits, the balance. The same for the 2 offers of a small fleet as for the 40-odd of every model.
LAUNCH_PRICE_QUERIES = 4
SMALL_FLEET = "two: 1xA100-80GB:whole, 1xA30:shared=3"
EVERY_MODEL = (
    "all: 1xH200:mig, 1xH100:mig, 1xA100-80GB:mig, 1xA100-40GB:mig, 1xA30:mig, 1xL4:whole, 1xL40S:shared=4,"
    " 1xT4:shared=2"
)


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
            holdings.started(session.slice_id, database_now() - timedelta(minutes=index + 1))
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


@pytest.mark.parametrize(("spec", "at_least"), [(SMALL_FLEET, 2), (EVERY_MODEL, 30)])
def test_the_launch_forms_prices_take_the_same_queries_for_2_offers_and_for_many(
    db: None,
    settings,  # type: ignore[no-untyped-def]
    alice: User,
    staff: User,
    spec: str,
    at_least: int,
    django_assert_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    use_fleet(settings, spec)
    ledger.grant_credit(alice, "17.10", by=staff, reason="course")
    requests = [offer.request for offer in offers()]
    assert len(requests) >= at_least
    with django_assert_num_queries(LAUNCH_PRICE_QUERIES):
        priced = BillingPricing().prices(alice, requests)
    assert set(priced) == set(requests)  # every offer priced, on both markets
    assert all(price.per_hour.endswith("CNY") and price.spot_per_hour for price in priced.values())
    share = next(request for request in requests if request.kind == "shared")
    whole = BillingPricing().per_minute(share, "on_demand")
    assert whole is not None and priced[share].per_hour == money.shown(whole * 60)  # 1/N of the GPU
