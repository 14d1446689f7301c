"""The Sessions page as people see it in Chromium: who may not launch is told why, a crash looks like one,
and a start that waits for the notebook service says so."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import WAITING_FOR_HUB, ContainerEnd, record_event
from tests.e2e.conftest import log_in
from tests.factories import make_user, running_session

pytestmark = pytest.mark.django_db(transaction=True)


def test_someone_outside_the_users_group_sees_why_and_no_form(
    portal_server: str, page: Page, notebook_image: NotebookImage, roles: None
) -> None:
    make_user("nadia", [])
    log_in(page, portal_server, "nadia")
    page.goto(portal_server + "/sessions/")
    expect(page.get_by_role("status").filter(has_text="not in the 'users' group")).to_contain_text(
        "Ask an operator of this portal to add you."
    )
    expect(page.get_by_role("button", name="Start JupyterLab")).to_have_count(0)
    page.screenshot(path="artifacts/screenshots/sessions-outsider.png", full_page=True)


def test_a_crash_and_a_waiting_start_look_like_what_they_are(
    portal_server: str, page: Page, notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    crashed = running_session(alice, notebook_image, SliceRequest("mig", "1g.18gb"), "crashed")
    record_event(crashed.pk, "stopped", end=ContainerEnd(exit_code=137, oom_killed=True))
    stopped = running_session(alice, notebook_image, SliceRequest("mig", "1g.18gb"), "stopped")
    NotebookSession.objects.filter(pk=stopped.pk).update(state=NotebookSession.State.STOPPING)
    record_event(stopped.pk, "stopped", end=ContainerEnd(exit_code=0))
    waiting = NotebookSession.objects.create(
        owner=alice,
        server_name="waiting",
        image=notebook_image,
        state=NotebookSession.State.STARTING,
        progress=10,
        progress_message=WAITING_FOR_HUB,
        progress_at=timezone.now() - timedelta(seconds=settings.SLOW_STEP_SECONDS + 30),
    )
    log_in(page, portal_server, "alice")
    page.goto(portal_server + "/sessions/")
    cards = page.locator("article.session-card")

    def card(name: str):  # type: ignore[no-untyped-def]
        return cards.filter(has=page.get_by_role("link", name=name, exact=True))

    crash_card = card("crashed")
    expect(crash_card.get_by_test_id("state")).to_have_text("Crashed")
    expect(crash_card).to_contain_text("it ran out of memory (exit code 137)")
    expect(card("stopped").get_by_test_id("state")).to_have_text("Stopped")
    waiting_card = card(waiting.server_name)
    expect(waiting_card).to_contain_text(WAITING_FOR_HUB)
    expect(waiting_card).to_contain_text("This step has taken 1\xa0minute so far")
    page.screenshot(path="artifacts/screenshots/sessions-crash-stop-waiting.png", full_page=True)
    page.goto(portal_server + f"/sessions/{crashed.pk}/")
    ended = page.locator("dl.facts > div").filter(has=page.get_by_text("Ended", exact=True)).locator("dd")
    expect(ended).to_contain_text("Its container stopped unexpectedly")
    expect(ended).not_to_have_text("—")
    page.screenshot(path="artifacts/screenshots/session-crashed-detail.png", full_page=True)
