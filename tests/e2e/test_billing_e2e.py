"""Money in Chromium: prices and the balance on the launch form, a session started by clicking (the real hub,
worker and Docker) with its cost on its card and the balance moving once the meter charges it, a session's cost
rising on its card and on the billing page, the zero-balance warning arriving over the websocket, and staff
adding credit."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from billing import costs, credit, ledger, meter, money, seeds
from billing.models import Price
from billing.tasks import charge_accrued
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.factories import running_session

pytestmark = pytest.mark.django_db(transaction=True)
H200_3G = SliceRequest("mig", "3g.71gb")


def running_for(owner: User, image: NotebookImage, name: str, seconds: float) -> NotebookSession:
    """A running session whose container started ``seconds`` ago by the meter's (the database's) clock."""
    session = running_session(owner, image, H200_3G, name)
    started = database_now() - timedelta(seconds=seconds)
    NotebookSession.objects.filter(pk=session.pk).update(container_started_at=started, ready_at=started)
    holdings.started(session.slice_id, started)  # type: ignore[arg-type]
    return session


@pytest.fixture
def priced(notebook_image: NotebookImage) -> NotebookImage:
    seeds.ensure(Price)  # a transactional test before this one flushed the migration's prices
    return notebook_image


def test_prices_balance_and_a_cost_that_rises_live(
    portal_server: str, page: Page, alice: User, staff: User, priced: NotebookImage
) -> None:
    ledger.grant_credit(alice, "17.10", by=staff, reason="course")
    running_for(alice, priced, "lab", seconds=57)  # its second minute begins in about 3 s
    log_in(page, portal_server, "alice")
    expect(page.locator("#card-billing").get_by_test_id("balance")).to_have_text("17.10 CNY")
    page.goto(portal_server + "/sessions/")
    prices = page.locator("table.offer-prices")
    expect(prices.get_by_role("row", name=re.compile("MIG 3g.71gb"))).to_contain_text("8.99 CNY")
    expect(page.get_by_test_id("launch-balance")).to_have_text("17.10 CNY")
    expect(page.locator("#launch")).to_contain_text("Billing is per started minute")
    card_cost = page.locator("article.session-card").get_by_test_id("cost")
    expect(card_cost).to_have_attribute("data-minutes", "1")
    expect(card_cost).to_have_attribute("data-minutes", "2", timeout=15_000)  # no reload: htmx at the minute
    page.screenshot(path=str(SCREENSHOTS / "billing-launch-form-and-card-cost.png"), full_page=True)
    page.goto(portal_server + "/billing/")
    expect(page.get_by_test_id("balance")).to_have_text("17.10 CNY")
    expect(page.get_by_test_id("burn")).to_have_text("8.99 CNY/h")
    expect(page.get_by_test_id("time-left")).to_contain_text("1 h 54 min")
    expect(page.get_by_role("heading", name="Invoices")).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "billing-account-page.png"), full_page=True)


@pytest.mark.hub
@pytest.mark.docker
@pytest.mark.celery
def test_a_person_starts_a_priced_session_by_clicking_and_sees_its_cost_and_the_balance_move(
    hub: str, page: Page, alice: User, staff: User, priced: NotebookImage
) -> None:
    ledger.grant_credit(alice, "17.10", by=staff, reason="course")
    log_in(page, hub, "alice")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Sessions").click()
    offer = page.locator("table.offer-prices").get_by_role("row", name=re.compile("MIG 2g.35gb"))
    expect(offer).to_contain_text("5.99 CNY")
    expect(page.get_by_test_id("launch-balance")).to_have_text("17.10 CNY")
    page.get_by_label("GPU slice").select_option("mig:H200-SXM5-141GB:2g.35gb")
    page.get_by_label("Session name").fill("paid")
    page.get_by_role("button", name="Start JupyterLab").click()
    card = page.locator("article.session-card", has_text="paid")
    expect(card.get_by_text("Running", exact=True)).to_be_visible(timeout=60_000)
    session = NotebookSession.objects.get(owner=alice, server_name="paid")
    assert session.slice is not None
    rate = costs.per_minute_of(session.slice)
    assert rate is not None
    expect(card.get_by_test_id("cost")).to_have_text(money.shown(rate), timeout=15_000)  # its first minute

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Billing").click()
    expect(page.get_by_test_id("balance")).to_have_text("17.10 CNY")
    expect(page.get_by_test_id("burn")).to_have_text("5.99 CNY/h")
    expect(page.get_by_test_id("not-yet-charged")).to_have_count(1)  # the history: its minutes so far
    page.wait_for_timeout(1000)  # the notification socket is open
    assert charge_accrued.delay().get(timeout=60)["minutes"] >= 1  # the worker's meter tick
    charged = money.shown(ledger.balance(alice))
    assert charged != "17.10 CNY"
    expect(page.get_by_test_id("balance")).to_have_text(charged, timeout=10_000)  # moved, without a reload
    expect(page.get_by_test_id("not-yet-charged")).to_have_count(0)  # and the history says it is charged
    page.screenshot(path=str(SCREENSHOTS / "billing-balance-moved.png"), full_page=True)

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Sessions").click()
    card.get_by_role("button", name="Stop").click()
    expect(card.get_by_text("Stopped", exact=True)).to_be_visible(timeout=60_000)


def test_the_zero_balance_warning_arrives_without_a_reload(
    portal_server: str, page: Page, bob: User, priced: NotebookImage
) -> None:
    running_for(bob, priced, "broke", seconds=30)
    log_in(page, portal_server, "bob")
    expect(page.get_by_test_id("zero-balance")).to_have_count(0)
    page.wait_for_timeout(1000)  # the notification socket is open
    assert credit.check_balances()["warned"] == 1
    expect(page.get_by_test_id("zero-balance")).to_contain_text("Your credit has run out", timeout=10_000)
    page.screenshot(path=str(SCREENSHOTS / "billing-zero-balance-dashboard.png"), full_page=True)


def test_staff_add_credit_and_bad_amounts_are_refused(portal_server: str, page: Page, alice: User, staff: User) -> None:
    log_in(page, portal_server, "charlie")
    page.get_by_role("link", name="Credit").click()
    page.get_by_label("Person").fill("alice")
    page.get_by_label("Amount").fill("-5")
    page.get_by_label("Reason").fill("refund")
    page.get_by_role("button", name="Add credit").click()
    expect(page.locator(".has-error")).to_contain_text("Credit must be more than zero.")
    page.screenshot(path=str(SCREENSHOTS / "billing-credit-refused.png"), full_page=True)
    page.get_by_label("Amount").fill("40")
    page.get_by_role("button", name="Add credit").click()
    expect(page.get_by_role("status")).to_contain_text("Added 40.00 CNY to alice")
    expect(page.get_by_test_id("credit-row").first).to_contain_text("refund")
    page.screenshot(path=str(SCREENSHOTS / "billing-credit-page.png"), full_page=True)


def test_minutes_charged_past_an_end_come_back_on_the_billing_page_with_why(
    portal_server: str, page: Page, alice: User, staff: User, priced: NotebookImage
) -> None:
    ledger.grant_credit(alice, "5.00", by=staff, reason="course")
    session = running_for(alice, priced, "late", seconds=185)
    assert session.slice_id is not None
    holdings.seen([session.slice_id])  # seen running now, by a clock ahead of the engine's
    meter.tick()  # four minutes
    held_from = database_now() - timedelta(seconds=185)
    holdings.ended(session.slice_id, held_from, held_from + timedelta(seconds=150))  # it had died: three
    assert meter.charge_holding(session.slice_id).settled == 1
    log_in(page, portal_server, "alice")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Billing").click()
    given_back = page.locator('[data-testid="money-in-row"][data-kind="settlement"]')
    expect(given_back).to_contain_text("given back")
    expect(given_back).to_contain_text("1 minute charged after Notebook session")
    page.locator("#money-in").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "billing-money-given-back.png"), full_page=True)
