"""A render job's page in Chromium, its rows written straight into the database: the live figures of frames
that take less than a second, as the socket brings them, and the gallery of a job with many frames, a
page of thumbnails at a time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from portal import push
from sessions.render import progress
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.helpers.page_watch import PageWatch
from tests.render.stack import own_folder

pytestmark = pytest.mark.django_db(transaction=True)
OFFER = {"gpu_kind": "mig", "gpu_profile": "1g.18gb", "gpu_model": "H200-SXM5-141GB"}


@pytest.fixture
def render_dir(settings) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """The portal server's render folder (the data folder's), for the files a job's page links to."""
    with own_folder("job-page") as folder:
        settings.RENDER_DIR = folder
        yield folder


def a_job(owner: User, count: int, state: str) -> RenderJob:
    frames = list(range(1, count + 1))
    return RenderJob.objects.create(
        owner=owner,
        state=state,
        upload_name="scene.blend",
        folder=f"t{owner.pk}/page",
        main_file="scene.blend",
        frame_spec=f"1-{count}",
        frames=frames,
        frame_count=count,
        queued_at=timezone.now() - timedelta(minutes=1),
        **OFFER,
    )


def frames_done(job: RenderJob, began: object, numbers: list[int], every_s: float) -> None:
    """Frames of the job's one chunk saved ``every_s`` apart from the chunk's start."""
    assert isinstance(began, type(timezone.now()))
    for number in numbers:
        finished = began + timedelta(seconds=every_s * number)
        RenderFrame.objects.update_or_create(
            job=job, number=number, defaults={"state": RenderFrame.State.DONE, "finished_at": finished}
        )


def pushed_until_shown(page: Page, job: RenderJob, done: int) -> None:
    """Push the job's figures until its page shows ``done`` frames done (a push before its socket opened is
    lost: nobody was following yet)."""
    region = page.locator(f'[data-render-progress="/ws/render/{job.pk}/"]')
    for _ in range(40):
        push.render_progress(job.owner_id, job.pk, progress.snapshot(RenderJob.objects.get(pk=job.pk)))
        try:
            expect(region.locator('[data-field="frames_done"]')).to_have_text(str(done), timeout=500)
            return
        except AssertionError:
            continue
    raise AssertionError(f"the page never showed {done} frames done")


def test_frames_of_a_third_of_a_second_show_their_average_and_time_left_live_not_0_s(
    portal_server: str, page: Page, alice: User, render_dir: Path
) -> None:
    job = a_job(alice, 6, RenderJob.State.RENDERING)
    began = timezone.now() - timedelta(seconds=10)
    RenderChunk.objects.create(job=job, index=0, frames=job.frames, state="rendering", attempts=1, started_at=began)
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in job.frames])
    frames_done(job, began, [1, 2], every_s=0.3)
    watch = PageWatch.on(page)
    log_in(page, portal_server, "alice")
    page.goto(f"{portal_server}/sessions/render-jobs/{job.pk}/")
    region = page.locator(f'[data-render-progress="/ws/render/{job.pk}/"]')
    expect(region.locator('[data-field="seconds_per_frame"]')).to_have_text("0.3 s")

    frames_done(job, began, [3, 4], every_s=0.3)
    pushed_until_shown(page, job, done=4)

    expect(region.locator('[data-field="seconds_per_frame"]')).to_have_text("0.3 s")
    expect(region.locator('[data-field="eta"]')).to_have_text("0.6 s")  # two frames left, one chunk rendering
    page.screenshot(path=str(SCREENSHOTS / "render-job-sub-second-frames.png"), full_page=True)
    watch.assert_clean("a job page with sub-second frames")
