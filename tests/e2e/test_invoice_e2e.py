"""An invoice in Chromium: a person finds last month's on their billing page, opens it, sees its print
layout, and downloads its CSV; someone else gets 404."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from billing import invoices, meter, money
from portal.clock import database_now
from tests.billing import conftest as billing
from tests.billing.conftest import H200_3G, Hold
from tests.e2e.conftest import SCREENSHOTS, log_in

pytestmark = pytest.mark.django_db(transaction=True)
fleet, hold = billing.fleet, billing.hold  # the billing tests' real holdings, as fixtures here


def test_a_person_opens_and_downloads_last_months_invoice(
    portal_server: str, page: Page, alice: User, bob: User, hold: Hold, tmp_path: Path
) -> None:
    last = invoices.month_bounds(invoices.last_month())[0]
    now = database_now()
    hold(alice, now - (last - timedelta(minutes=10, seconds=30)), lasted=timedelta(minutes=25))
    hold(alice, now - (last + timedelta(days=3, hours=4)), H200_3G, lasted=timedelta(minutes=7, seconds=5))
    meter.tick()
    invoice = invoices.issue(alice, last.date())
    assert invoice is not None
    log_in(page, portal_server, "alice")
    page.goto(portal_server + "/billing/")
    listing = page.get_by_test_id("invoice-list")
    expect(listing).to_contain_text(invoice.label)
    expect(listing).to_contain_text(f"{last:%B %Y}")
    listing.screenshot(path=str(SCREENSHOTS / "invoice-list-on-billing-page.png"))
    listing.get_by_role("link", name=invoice.label).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Invoice {invoice.label}")
    expect(page.get_by_test_id("invoice-line")).to_have_count(2)
    expect(page.get_by_test_id("invoice-minutes")).to_have_text("22")
    expect(page.get_by_test_id("invoice-total")).to_have_text(money.shown(invoice.total))
    expect(page.get_by_text("Credit applied is the part")).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "invoice-page.png"), full_page=True)

    page.emulate_media(media="print")  # the print stylesheet: the document alone, no navigation or buttons
    expect(page.locator("header.topbar")).to_be_hidden()
    expect(page.get_by_role("link", name="Download CSV")).to_be_hidden()
    page.screenshot(path=str(SCREENSHOTS / "invoice-print-layout.png"), full_page=True)
    pdf = page.pdf(path=str(tmp_path / "invoice.pdf"))
    assert pdf.startswith(b"%PDF")
    page.emulate_media(media="screen")

    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    assert download.value.suggested_filename == f"{invoice.label}-{last:%Y-%m}.csv"
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert rows[0][:2] == ["invoice", invoice.label]
    assert [row[10] for row in rows[2:4]] == ["14", "8"]
    assert ["total", str(invoice.total)] in rows

    page.context.clear_cookies()
    log_in(page, portal_server, "bob")
    response = page.goto(f"{portal_server}/billing/invoices/{invoice.number}/")
    assert response is not None and response.status == 404
