"""Log in through headless Chromium against the real daphne server."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_user_logs_in_sees_the_dashboard_and_logs_out(portal_server: str, page: Page, staff: User) -> None:
    page.goto(portal_server + "/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
    page.get_by_label("Username").fill("charlie")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Dashboard")
    nav = page.get_by_role("navigation", name="Main")
    for label in ("Sessions", "Render jobs", "Billing", "Fleet", "Admin"):
        expect(nav.get_by_role("link", name=label, exact=True)).to_be_visible()
    expect(page.get_by_role("heading", name="Background workers")).to_be_visible()
    page.screenshot(path="artifacts/screenshots/dashboard.png", full_page=True)
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/$"))


def test_a_wrong_password_shows_an_error_in_the_browser(portal_server: str, page: Page, alice: User) -> None:
    page.goto(portal_server + "/accounts/login/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("wrong password")
    page.keyboard.press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("Please enter a correct username and password")
