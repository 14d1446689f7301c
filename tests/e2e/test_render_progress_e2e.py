# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A rendering job's page in Chromium, on the real render stack: the figures the render worker pushes over
/ws/render/<job>/ fill the page as they come (render-progress.js, under the CSP), and Cancel stops it."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from sessions.render import services
from sessions.render.models import RenderJob
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.helpers.page_watch import PageWatch
from tests.render.stack import (  # noqa: F401 (fixtures)
    containers_of,
    make_job,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    state_of,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State


def test_a_rendering_jobs_page_fills_in_live_and_its_cancel_stops_it(
    render_stack: Path, scenes: Path, portal_server: str, page: Page, alice: User
) -> None:
    job = make_job(alice, scenes / "slow.blend", [1, 2], State.AWAITING_CONFIRMATION, chunk_size=2)
    services.confirm(job.pk, alice)
    watch = PageWatch.on(page)
    log_in(page, portal_server, "alice")
    page.goto(f"{portal_server}/sessions/render-jobs/{job.pk}/")
    region = page.locator(f'[data-render-progress="/ws/render/{job.pk}/"]')
    expect(region).to_be_visible()

    # Only the socket carries the sample count: the page as served shows a dash there.
    expect(region.locator('[data-field="samples"]')).to_have_text("4096", timeout=120_000)
    expect(region.locator('[data-field="state_label"]')).to_have_text("Rendering")
    expect(region.locator('[data-field="device"]')).to_have_text("CPU")
    expect(region.locator('[data-field="frames_total"]')).to_have_text("2")
    page.screenshot(path=str(SCREENSHOTS / "render-job-live.png"), full_page=True)

    page.get_by_role("button", name="Cancel this job").click()
    expect(page.get_by_test_id("state")).to_have_text("Cancelled")
    assert state_of(job) == State.CANCELLED
    wait_for(lambda: not containers_of(job), 30, "its container stopped and removed")
    watch.assert_clean("the rendering job's page")
