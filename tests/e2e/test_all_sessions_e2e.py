"""An operator watches everyone's sessions in Chromium, with live utilisation, and stops one in place."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.conftest import ARTIFACTS
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.factories import running_session
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.page_watch import PageWatch

pytestmark = pytest.mark.django_db(transaction=True)
FLEET = "all: 1xH200:mig, 1xL4:whole"


@pytest.fixture
def sessions(settings, notebook_image: NotebookImage, alice: User, bob: User) -> Iterator[list[NotebookSession]]:  # type: ignore[no-untyped-def]
    use_fleet(settings, FLEET)
    made = [
        running_session(alice, notebook_image, SliceRequest("mig", "2g.35gb", host="all"), "alice-lab"),
        running_session(bob, notebook_image, SliceRequest("whole", host="all"), "bob-lab"),
    ]
    process = processes.start_gpu_agent(FLEET, ARTIFACTS / "logs" / "gpu-agent-all-sessions.log")
    yield made
    processes.stop(process)


def test_an_operator_sees_everyones_sessions_live_and_stops_one_in_place(
    portal_server: str, page: Page, staff: User, sessions: list[NotebookSession]
) -> None:
    bobs = sessions[1]
    watch = PageWatch.on(page)
    log_in(page, portal_server, "charlie")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="All sessions").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("All sessions")
    rows = page.locator("#all-sessions tbody tr")
    expect(rows).to_have_count(2)
    alice_row, bob_row = rows.nth(0), rows.nth(1)
    expect(alice_row.get_by_test_id("owner")).to_have_text("alice")
    expect(alice_row).to_contain_text("2g.35gb at memory slice")
    expect(bob_row.get_by_test_id("owner")).to_have_text("bob")
    expect(bob_row).to_contain_text("Whole GPU on")
    for row in (alice_row, bob_row):
        expect(row.get_by_test_id("state")).to_have_text("Running")
        expect(row.locator(".badge.sim")).to_be_visible()  # simulated data says so
        # The agent's frames reach the page: a figure, or "n/a" where the device reports none; never "—".
        expect(row.get_by_test_id("utilisation")).to_contain_text("%")
    page.screenshot(path=str(SCREENSHOTS / "all-sessions.png"), full_page=True)

    bob_row.get_by_role("button", name="Stop bob-lab of bob").click()
    expect(bob_row.get_by_test_id("state")).to_have_text("Stopping")
    expect(bob_row.get_by_role("button")).to_have_count(0)
    expect(alice_row.get_by_test_id("state")).to_have_text("Running")
    assert page.url.endswith("/sessions/all/")  # swapped in place, no navigation
    bobs.refresh_from_db()
    assert (bobs.state, bobs.ended_reason) == (NotebookSession.State.STOPPING, NotebookSession.EndReason.STAFF)
    page.screenshot(path=str(SCREENSHOTS / "all-sessions-stopped.png"), full_page=True)
    watch.assert_clean("all sessions")


def test_a_user_has_no_all_sessions_page(
    portal_server: str, page: Page, alice: User, sessions: list[NotebookSession]
) -> None:
    log_in(page, portal_server, "alice")
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="All sessions")).to_have_count(0)
    response = page.goto(portal_server + "/sessions/all/")
    assert response is not None and response.status == 403
