"""A spot reclaim as people see it in Chromium: the spot session's card and dashboard get its notice live, over the
websocket, and the on-demand launch that waits shows how far through the grace time it is."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session
from tests.e2e.conftest import log_in
from tests.factories import running_session

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_spot_owner_sees_the_notice_arrive_and_the_waiting_launch_shows_its_wait(
    portal_server: str, page: Page, browser: Browser, notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    spot = running_session(bob, notebook_image, SliceRequest("mig", "7g.141gb", market="spot"), "cheap")
    NotebookSession.objects.filter(pk=spot.pk).update(spot=True)
    log_in(page, portal_server, "bob")
    page.goto(portal_server + "/sessions/")
    card = page.locator(f"#session-{spot.pk}")
    expect(card.get_by_test_id("state")).to_have_text("Running")
    expect(card.get_by_test_id("session-notice")).to_have_count(0)
    board = browser.new_page()  # bob's dashboard, open before the reclaim
    log_in(board, portal_server, "bob")
    board.goto(portal_server + "/")
    expect(board.get_by_role("alert").filter(has_text="is reclaimed")).to_have_count(0)
    page.wait_for_timeout(1000)  # the notification sockets connect

    waiting = start_session(alice, Launch(SliceRequest("mig", "3g.71gb"), notebook_image.pk, "urgent"))
    assert waiting.state == NotebookSession.State.ALLOCATING
    notice = card.get_by_test_id("session-notice")
    expect(notice).to_contain_text("is reclaimed for an on-demand session: it stops at")  # no reload: pushed
    expect(notice).to_contain_text("Save your work to work/ now.")
    page.screenshot(path="artifacts/screenshots/spot-notice-on-card.png", full_page=True)
    # The dashboard gets it too, without a reload (static/js/billing.js fetches the notices again).
    expect(board.get_by_role("alert").filter(has_text="is reclaimed for an on-demand session")).to_have_count(1)
    board.screenshot(path="artifacts/screenshots/spot-notice-on-dashboard.png", full_page=True)
    board.close()

    other = browser.new_page()
    log_in(other, portal_server, "alice")
    other.goto(portal_server + "/sessions/")
    waiting_card = other.locator(f"#session-{waiting.pk}")
    expect(waiting_card.get_by_test_id("state")).to_have_text("Allocating a GPU slice")
    expect(waiting_card).to_contain_text("Waiting for a spot session to hand over its slice, at")
    expect(waiting_card.locator("progress")).to_have_count(1)
    other.screenshot(path="artifacts/screenshots/spot-waiting-launch.png", full_page=True)
    other.close()
