"""The price tables beside the launch forms (a notebook session's, a render job's upload) in Chromium, on a
1280 px and a 390 px wide screen: every offer's prices and what the balance covers are readable, nothing is
cut off or scrolls sideways, no price or time breaks over two lines, and the columns line up (screenshots
saved, looked at)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from billing import ledger, seeds
from billing.models import Price
from sessions.notebooks.models import NotebookImage
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.gpus.conftest import use_fleet

pytestmark = pytest.mark.django_db(transaction=True)

# Per cell: whether its text runs over more than one line, and whether it is cut off.
CELLS = """table => Array.from(table.querySelectorAll('tbody td, tbody th')).map(cell => {
  const range = document.createRange();
  const shown = Array.from(cell.querySelectorAll('[data-price]'));
  const lines = shown.map(part => { range.selectNodeContents(part); return range.getClientRects().length; });
  return {text: cell.textContent.trim(), lines: Math.max(0, ...lines), cut: cell.scrollWidth > cell.clientWidth + 1,
          size: parseFloat(getComputedStyle(cell).fontSize)};
})"""
FITS = """table => {
  const card = table.closest('.card');
  return {table: table.getBoundingClientRect().right, card: card.getBoundingClientRect().right,
          page: document.documentElement.scrollWidth, viewport: window.innerWidth};
}"""
# The left edges of each row's price cells: the columns line up when every row gives the same ones.
EDGES = """table => Array.from(table.querySelectorAll('tbody tr')).map(row =>
  Array.from(row.querySelectorAll('td')).map(cell => Math.round(cell.getBoundingClientRect().left)))"""


@pytest.fixture
def offers(notebook_image: NotebookImage, settings: Any) -> NotebookImage:
    seeds.ensure(Price)  # a transactional test before this one flushed the migration's prices
    use_fleet(settings, "prices: 1xH200:mig, 1xA100-80GB:whole, 1xA30:shared=3, 1xL4:whole")
    return notebook_image


# Each form with the offers' prices: its page, and the card that holds the form.
FORMS = {"launch": ("/sessions/", "#launch"), "render": ("/sessions/render-jobs/", "#render-upload")}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("width", [1280, 390])
def test_the_price_table_is_readable_on_a_wide_and_a_narrow_screen(
    portal_server: str, page: Page, alice: User, staff: User, offers: NotebookImage, width: int, form: str
) -> None:
    ledger.grant_credit(alice, "17.10", by=staff, reason="course")
    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, portal_server, "alice")
    address, card = FORMS[form]
    page.goto(portal_server + address)
    table = page.locator(f"{card} table.offer-prices")
    expect(table.get_by_test_id("offer-price").first).to_be_visible()
    rows = table.get_by_test_id("offer-price")
    assert rows.count() >= 5  # MIG profiles of the H200, the A100, the A30 share, the L4
    expect(table).to_contain_text("8.99 CNY")
    page.locator(card).screenshot(path=str(SCREENSHOTS / f"{form}-prices-{width}.png"))
    cells = table.evaluate(CELLS)
    priced = [cell for cell in cells if cell["lines"]]
    assert priced, cells
    assert [cell for cell in priced if cell["lines"] > 1] == []  # no price or time breaks over two lines
    assert [cell for cell in cells if cell["cut"]] == []
    assert min(cell["size"] for cell in cells) >= 13  # px: readable, not squeezed smaller
    fits = table.evaluate(FITS)
    assert fits["table"] <= fits["card"] and fits["page"] <= fits["viewport"], fits  # nothing scrolls sideways
    edges = table.evaluate(EDGES)
    assert len({tuple(row) for row in edges if len(row) == len(edges[0])}) == 1, edges  # columns line up
