"""Single sign-on in the browser: logged into the portal, JupyterLab opens without a second login."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session
from tests.e2e.conftest import log_in
from tests.helpers.waiting import state_of, wait_for

pytestmark = [pytest.mark.hub, pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_jupyterlab_opens_through_the_proxy_with_the_portal_login_and_not_for_others(
    hub: str, notebook_image: NotebookImage, alice: User, bob: User, page: Page, browser: Browser
) -> None:
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "lab-e2e"))
    wait_for(lambda: state_of(session) == NotebookSession.State.RUNNING, 120, "the session to run")
    log_in(page, hub, "alice")
    page.goto(hub + "/jupyter/user/alice/lab-e2e/lab")
    expect(page).to_have_url(re.compile(r"/jupyter/user/alice/lab-e2e/lab"), timeout=30_000)
    expect(page).to_have_title(re.compile("JupyterLab"), timeout=30_000)
    page.wait_for_timeout(1500)
    page.screenshot(path="artifacts/screenshots/jupyterlab-through-sso.png")
    page.goto(hub + "/jupyter/hub/home")
    expect(page.get_by_role("heading", level=1)).to_have_text("Your sessions live in the portal")
    page.get_by_role("button", name="Go to your sessions").click()
    expect(page).to_have_url(hub + "/sessions/")

    other = browser.new_context()
    bobs_page = other.new_page()
    log_in(bobs_page, hub, "bob")
    answer = bobs_page.goto(hub + "/jupyter/user/alice/lab-e2e/lab")
    assert answer is not None
    expect(bobs_page.locator("body")).to_contain_text("403 : You do not have permission to access Server")
    bobs_page.screenshot(path="artifacts/screenshots/jupyterlab-refused-to-bob.png")
    other.close()


def test_a_user_launches_opens_and_stops_a_session_by_clicking(
    hub: str, notebook_image: NotebookImage, alice: User, page: Page
) -> None:
    log_in(page, hub, "alice")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Sessions").click()
    page.get_by_label("GPU slice").select_option("mig:H200-SXM5-141GB:2g.35gb")
    page.get_by_label("Session name").fill("clicked")
    page.get_by_role("button", name="Start JupyterLab").click()
    card = page.locator("article.session-card", has_text="clicked")
    expect(card).to_be_visible()
    page.screenshot(path="artifacts/screenshots/session-starting.png", full_page=True)
    expect(card.get_by_text("Running", exact=True)).to_be_visible(timeout=60_000)
    page.screenshot(path="artifacts/screenshots/session-running.png", full_page=True)
    with page.context.expect_page() as opened:
        card.get_by_role("link", name="Open JupyterLab").click()
    lab = opened.value
    expect(lab).to_have_title(re.compile("JupyterLab"), timeout=30_000)
    lab.close()
    card.get_by_role("button", name="Stop").click()
    expect(card.get_by_text("Stopped", exact=True)).to_be_visible(timeout=60_000)
    page.screenshot(path="artifacts/screenshots/session-stopped.png", full_page=True)
    session = NotebookSession.objects.get(owner=alice, server_name="clicked")
    assert session.container_gone_at is not None and session.slice is not None and not session.slice.active
