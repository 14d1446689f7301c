"""A group invoice in Chromium: a member granted the permission finds their billed group's invoice on their
billing page, opens it, sees each member's lines and totals and its print layout, and downloads its CSV;
a member without the permission gets 404."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, Permission, User
from playwright.sync_api import Page, expect

from billing import group_invoices, invoices, meter, money
from portal.clock import database_now
from tests.billing import conftest as billing
from tests.billing.conftest import H200_3G, Hold
from tests.e2e.conftest import SCREENSHOTS, log_in

pytestmark = pytest.mark.django_db(transaction=True)
fleet, hold = billing.fleet, billing.hold  # the billing tests' real holdings, as fixtures here


def test_a_treasurer_opens_prints_and_downloads_the_groups_invoice(
    portal_server: str, page: Page, alice: User, bob: User, staff: User, hold: Hold
) -> None:
    last, now = invoices.month_bounds(invoices.last_month())[0], database_now()
    hold(alice, now - (last + timedelta(days=2)), lasted=timedelta(minutes=24, seconds=30))
    hold(alice, now - (last + timedelta(days=3)), H200_3G, lasted=timedelta(minutes=7, seconds=5))
    hold(bob, now - (last + timedelta(days=4)), lasted=timedelta(minutes=2, seconds=1))
    meter.tick()
    lab = Group.objects.create(name="physics")
    lab.user_set.add(alice, bob)
    group_invoices.mark(lab, "Department of Physics", "accounts@physics.example.org", by=staff)
    found = group_invoices.issue(lab, last.date())
    assert found is not None
    bob.user_permissions.add(Permission.objects.get(codename="view_own_group_invoices"))

    log_in(page, portal_server, "bob")
    page.goto(portal_server + "/billing/")
    listing = page.get_by_test_id("group-invoice-list")
    expect(listing).to_contain_text(found.label)
    listing.get_by_role("link", name=found.label).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Group invoice {found.label}")
    expect(page.get_by_test_id("billed-to")).to_have_text("Department of Physics <accounts@physics.example.org>")
    expect(page.get_by_test_id("group-invoice-line")).to_have_count(3)
    expect(page.get_by_test_id("member-total")).to_have_count(2)
    expect(page.get_by_test_id("invoice-minutes")).to_have_text("36")
    expect(page.get_by_test_id("invoice-total")).to_have_text(money.shown(found.total))
    page.screenshot(path=str(SCREENSHOTS / "group-invoice-page.png"), full_page=True)

    page.emulate_media(media="print")
    expect(page.locator("header.topbar")).to_be_hidden()
    expect(page.get_by_role("link", name="Download CSV")).to_be_hidden()
    page.screenshot(path=str(SCREENSHOTS / "group-invoice-print-layout.png"), full_page=True)
    page.emulate_media(media="screen")

    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    assert download.value.suggested_filename == f"{found.label}-{last:%Y-%m}.csv"
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert rows[0][:2] == ["group invoice", found.label]
    assert [row[0] for row in rows[3:6]] == ["alice", "alice", "bob"]
    assert ["total", str(found.total)] in rows

    page.context.clear_cookies()
    log_in(page, portal_server, "alice")  # a member, not granted the permission
    response = page.goto(f"{portal_server}/billing/group-invoices/{found.number}/")
    assert response is not None and response.status == 404


def test_staff_bill_a_group_from_the_credit_page(portal_server: str, page: Page, alice: User, staff: User) -> None:
    Group.objects.create(name="chemistry").user_set.add(alice)
    log_in(page, portal_server, "charlie")
    page.get_by_role("link", name="Credit").click()
    page.get_by_role("link", name="Billed groups").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Billed groups")
    page.get_by_label("Group", exact=True).select_option(label="chemistry")
    page.get_by_label("Billed to").fill("Department of Chemistry")
    page.get_by_label("Billing e-mail").fill("accounts@chemistry.example.org")
    page.get_by_role("button", name="Bill this group").click()
    expect(page.get_by_role("status")).to_contain_text("Group chemistry is billed to Department of Chemistry")
    row = page.get_by_test_id("billed-groups").get_by_role("row", name="chemistry")
    expect(row).to_contain_text("Department of Chemistry")
    page.screenshot(path=str(SCREENSHOTS / "billed-groups-page.png"), full_page=True)
    row.get_by_role("button", name="Stop billing").click()  # no reason: the browser asks for one first
    expect(page.get_by_test_id("billed-groups")).to_have_count(1)
    row.get_by_label("Why stop billing chemistry").fill("the department pays by card now")
    row.get_by_role("button", name="Stop billing").click()
    expect(page.get_by_test_id("billed-groups")).to_have_count(0)
    changes = page.get_by_test_id("billed-group-changes")
    expect(changes.get_by_role("row", name="Billing stopped")).to_contain_text("the department pays by card now")
    expect(changes.get_by_test_id("change-row")).to_have_count(2)  # billed, then stopped: who, when, why
    expect(changes.get_by_test_id("change-row").last).to_contain_text("Department of Chemistry")
    expect(changes.get_by_test_id("change-row").last).to_contain_text("charlie")
    page.screenshot(path=str(SCREENSHOTS / "billed-groups-stopped.png"), full_page=True)
