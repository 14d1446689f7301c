# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A rendering job's page in Chromium, on the real render stack: the figures the render worker pushes over
/ws/render/<job>/ fill the page as they come (render-progress.js, under the CSP); the page as served already
shows the end of Blender's output; the jobs list shows the job's frames with a bar and follows its state
over /ws/render/; Cancel stops it."""

from __future__ import annotations

import re
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

    expect(region.locator('[data-field="samples"]')).to_have_text("4096", timeout=120_000)
    expect(region.locator('[data-field="state_label"]')).to_have_text("Rendering")
    expect(region.locator('[data-field="device"]')).to_have_text("CPU")
    expect(region.locator('[data-field="frames_total"]')).to_have_text("2")
    expect(region.get_by_test_id("log-tail")).to_contain_text("Fra:1")
    page.screenshot(path=str(SCREENSHOTS / "render-job-live.png"), full_page=True)

    # The same page loaded with its socket cut off: the end of Blender's output, the sample reached and where
    # Cycles renders are in the page as served (Blender prints a sample line only every few seconds).
    served = page.context.new_page()
    served.route_web_socket(re.compile(r"/ws/render/"), lambda socket: None)  # never reaches the portal
    served.goto(f"{portal_server}/sessions/render-jobs/{job.pk}/")
    expect(served.get_by_test_id("log-tail")).to_contain_text(re.compile(r"Fra:1 .*Sample \d+/4096"))
    expect(served.get_by_test_id("current-frame")).to_have_text(re.compile(r"^sample \d+ of 4096 · on CPU$"))
    served.screenshot(path=str(SCREENSHOTS / "render-job-served.png"), full_page=True)  # the tab in front
    served.close()

    # The jobs list shows its frames with a bar, and follows its state live.
    listed = page.context.new_page()
    listed_watch = PageWatch.on(listed)
    listed.goto(f"{portal_server}/sessions/render-jobs/")
    row = listed.locator(f"#render-job-{job.pk}")
    expect(row.get_by_test_id("state")).to_have_text("Rendering")
    expect(row.get_by_test_id("progress")).to_contain_text("0 of 2")
    expect(row.locator('progress[data-field="percent"]')).to_have_attribute("value", "0")
    listed.screenshot(path=str(SCREENSHOTS / "render-jobs-rendering.png"), full_page=True)

    page.bring_to_front()
    page.get_by_role("button", name="Cancel this job").click()
    expect(page.get_by_test_id("state")).to_have_text("Cancelled")
    assert state_of(job) == State.CANCELLED
    expect(row.get_by_test_id("state")).to_have_text("Cancelled")  # no reload of ours: the socket said so
    expect(row.get_by_role("button", name="Cancel slow.blend")).to_have_count(0)
    listed.bring_to_front()  # Chromium paints no background tab: a screenshot of one waits forever
    listed.screenshot(path=str(SCREENSHOTS / "render-jobs-cancelled-live.png"), full_page=True)
    wait_for(lambda: not containers_of(job), 30, "its container stopped and removed")
    watch.assert_clean("the rendering job's page")
    listed_watch.assert_clean("the jobs list following the job")
    listed.close()
    page.bring_to_front()
