"""The finance view in Chromium: staff with the finance permission see the revenue chart, drill down from
a day (on the chart and in its table) to a usage's minutes, and download a table as CSV."""

from __future__ import annotations

import csv
import io
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from billing import meter
from billing.models import Usage
from portal.clock import database_now
from tests.billing.conftest import Hold, fleet, hold  # noqa: F401 (fixtures)
from tests.e2e.conftest import SCREENSHOTS, log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_finance_staff_see_the_chart_drill_down_to_minutes_and_download_a_csv(
    portal_server: str,
    page: Page,
    hold: Hold,  # noqa: F811
    alice: User,
    billing_user: User,
) -> None:
    _not_across_midnight(timedelta(minutes=6))
    held = hold(alice, timedelta(minutes=5, seconds=30))
    assert meter.tick().minutes == 6
    usage = Usage.objects.get(slice=held)
    today = database_now().date()
    log_in(page, portal_server, "dora")
    page.get_by_role("link", name="Finance").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Finance")
    expect(page.locator("#revenue-chart canvas")).to_have_count(1)
    expect(page.get_by_test_id("revenue")).to_contain_text(f"{usage.per_minute * 6:.2f}")
    page.screenshot(path=str(SCREENSHOTS / "finance-overview.png"), full_page=True)

    # A click on the chart's last day (today, at its right edge) opens that day's usages.
    over = page.locator("#revenue-chart .u-over")
    box = over.bounding_box()
    assert box is not None
    over.hover(position={"x": box["width"] - 2, "y": box["height"] / 2})
    over.click(position={"x": box["width"] - 2, "y": box["height"] / 2})
    expect(page.get_by_role("heading", level=1)).to_have_text("Usages behind the figure")
    assert f"start={today}&end={today}" in page.url
    page.go_back()
    day_row = page.locator('[data-table="per_day"] tr', has_text=str(today))
    day_row.get_by_role("link", name="Details").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Usages behind the figure")
    expect(page.get_by_test_id("drill-total")).to_have_text(f"6 minutes, {usage.per_minute * 6:.2f} CNY")
    page.screenshot(path=str(SCREENSHOTS / "finance-day-usages.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")  # nothing runs off the page
    page.locator('[data-table="usages"] tr', has_text="alice").get_by_role("link", name="Details").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Usage {usage.pk}")
    expect(page.locator('[data-table="minutes"] tbody tr')).to_have_count(6)
    expect(page.get_by_test_id("usage-charged")).to_contain_text("6 minutes")
    page.screenshot(path=str(SCREENSHOTS / "finance-usage-minutes.png"), full_page=True)

    page.goto(portal_server + "/billing/finance/")
    with page.expect_download() as download:
        page.get_by_test_id("csv-users").click()
    assert download.value.suggested_filename.endswith("-users.csv")
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
    assert rows == [["Person", "Minutes", "Amount"], ["alice", "6", str(usage.per_minute * 6)]]


def _not_across_midnight(span: timedelta) -> None:
    """The test follows one day's usages (today's): a hold of ``span`` up to now must lie in it, so a run that
    starts just after midnight waits until it does (the minutes would otherwise split across two days)."""
    now = database_now()
    since_midnight = now - now.replace(hour=0, minute=0, second=0, microsecond=0)
    if since_midnight < span + timedelta(seconds=5):
        time.sleep((span + timedelta(seconds=5) - since_midnight).total_seconds())
