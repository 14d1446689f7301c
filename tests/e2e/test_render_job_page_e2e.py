"""A render job's page in Chromium, its rows written straight into the database: the live figures of frames
that take less than a second, as the socket brings them, and the gallery of a job with many frames, a
page of thumbnails at a time."""

from __future__ import annotations

# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
import re
import secrets
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from PIL import Image, ImageDraw
from playwright.sync_api import Locator, Page, expect

from portal import push
from sessions.render import progress, results
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.helpers.page_watch import PageWatch
from tests.render.stack import render_portal_server, render_root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)
OFFER = {"gpu_kind": "mig", "gpu_profile": "1g.18gb", "gpu_model": "H200-SXM5-141GB"}


@pytest.fixture
def render_dir(settings, render_root: Path) -> Path:  # type: ignore[no-untyped-def]
    """The render folder of the portal server these tests use (``render_portal_server``)."""
    settings.RENDER_DIR = render_root
    return render_root


def a_job(owner: User, count: int, state: str) -> RenderJob:
    frames = list(range(1, count + 1))
    return RenderJob.objects.create(
        owner=owner,
        state=state,
        upload_name="scene.blend",
        folder=f"t{owner.pk}/{secrets.token_hex(8)}",
        main_file="scene.blend",
        frame_spec=f"1-{count}",
        frames=frames,
        frame_count=count,
        queued_at=timezone.now() - timedelta(minutes=1),
        **OFFER,
    )


def frames_done(job: RenderJob, began: datetime, numbers: list[int], every_s: float) -> None:
    """Frames of the job's one chunk saved ``every_s`` apart from the chunk's start."""
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
    render_portal_server: str, page: Page, alice: User, render_dir: Path
) -> None:
    portal_server = render_portal_server
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


def with_thumbnails(job: RenderJob) -> None:
    """Each frame a thumbnail of its own (its number on a shade of its own), where the job's rows say."""
    folder = job.folder_path() / "thumbnails"
    folder.mkdir(parents=True)
    for frame in job.frame_results.all():
        image = Image.new("RGB", (160, 90), (40 + frame.number % 200, 90, 160 - frame.number % 120))
        ImageDraw.Draw(image).text((10, 35), f"frame {frame.number}", fill=(255, 255, 255))
        image.save(job.folder_path() / frame.thumbnail_path, "JPEG")


def thumbnails_loaded(gallery: Locator) -> None:
    """Every thumbnail of the gallery's page has loaded (lazily, each from the portal) at its size."""
    gallery.get_by_role("img").last.scroll_into_view_if_needed()
    for thumbnail in gallery.get_by_role("img").all():
        expect(thumbnail).to_have_js_property("complete", True)
        assert thumbnail.evaluate("image => image.naturalWidth") == 160


def test_a_job_of_many_frames_shows_its_gallery_a_page_at_a_time_and_htmx_swaps_the_gallery_alone(
    render_portal_server: str, page: Page, alice: User, render_dir: Path
) -> None:
    job = a_job(alice, 130, RenderJob.State.DONE)
    RenderFrame.objects.bulk_create(
        RenderFrame(job=job, number=n, state="done", output_path=f"f/{n}.png", thumbnail_path=f"thumbnails/{n}.jpg")
        for n in job.frames
    )
    with_thumbnails(job)
    per_page = results.GALLERY_FRAMES
    watch = PageWatch.on(page)
    log_in(page, render_portal_server, "alice")
    page.goto(f"{render_portal_server}/sessions/render-jobs/{job.pk}/")
    gallery = page.locator("#render-gallery")
    expect(gallery.get_by_test_id("gallery-range")).to_have_text(f"Frames 1–{per_page} of 130")
    expect(gallery.get_by_role("img")).to_have_count(per_page)
    page.evaluate("window.loadedOnce = true")  # gone if the whole page loads again
    # The thumbnails load lazily and, as each arrives, push the pager down: a click before they are all in
    # could land where the link was.
    thumbnails_loaded(gallery)

    gallery.get_by_role("link", name="Next").click()

    expect(gallery.get_by_test_id("gallery-range")).to_have_text(f"Frames {per_page + 1}–{2 * per_page} of 130")
    expect(gallery.get_by_role("img").first).to_have_attribute("alt", f"Frame {per_page + 1}")
    expect(page).to_have_url(re.compile(r"\?page=2$"))
    assert page.evaluate("window.loadedOnce") is True, "htmx swapped the gallery; the page was not loaded again"
    expect(gallery.get_by_test_id("gallery-pages")).to_contain_text("Page 2 of 3")
    thumbnails_loaded(gallery)
    page.screenshot(path=str(SCREENSHOTS / "render-job-gallery-page-2.png"), full_page=True)

    # The same address loaded afresh (a link shared, JavaScript or not) shows the same page of frames.
    page.goto(f"{render_portal_server}/sessions/render-jobs/{job.pk}/?page=3")
    expect(gallery.get_by_test_id("gallery-range")).to_have_text(f"Frames {2 * per_page + 1}–130 of 130")
    expect(gallery.get_by_role("link", name="Next")).to_have_count(0)
    watch.assert_clean("a job's gallery, paged")
