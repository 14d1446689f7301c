"""Browser tests: one screenshot per test into artifacts/screenshots/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.factories import PASSWORD

# Playwright's sync API runs an event loop in this thread; the ORM calls the
# tests make to set up rows are plain blocking calls, which is fine here.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(autouse=True)
def screenshot_after(request: pytest.FixtureRequest, page: Page) -> Iterator[None]:
    yield
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)


def log_in(page: Page, base_url: str, username: str) -> None:
    """Log in through the portal's form, as a person would, and land on the dashboard."""
    page.goto(base_url + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Dashboard")
