"""Uploading a scene in Chromium: it goes up in parts (tus) with the bar following it, the job is unpacked by
the worker, goes to its estimate and is listed; a file that is no scene comes back on the form in words."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from playwright.sync_api import Page, expect

from sessions.gpus.backends import get_backend
from sessions.render import jobs
from sessions.render.models import RenderJob
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.helpers.page_watch import PageWatch
from tests.render import scenes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def render_fleet(settings, celery_worker: str) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """A fleet to pick an offer from, and the worker that unpacks what is uploaded."""
    from tests.gpus.conftest import use_fleet

    use_fleet(settings, "e2e-render: 1xH200:mig")
    yield
    get_backend.cache_clear()


def a_big_blend() -> bytes:
    """A valid .blend of about 3 MiB, so the upload takes more than one progress event."""
    return scenes.blend(blocks=[*scenes.BLOCKS[:-1], (b"IM\x00\x00", b"\x09" * (3 << 20)), scenes.BLOCKS[-1]])


def test_a_scene_uploads_with_progress_goes_to_its_estimate_and_is_listed(
    portal_server: str, page: Page, alice: User, render_fleet: None
) -> None:
    watch = PageWatch.on(page)
    log_in(page, portal_server, "alice")
    page.goto(portal_server + "/sessions/render/")  # the short address leads to the page
    expect(page.get_by_role("heading", level=1)).to_have_text("Render jobs")
    seen: list[str] = []
    page.expose_function("reportUploadProgress", lambda words: seen.append(words))
    page.evaluate(
        """() => {
             const words = document.getElementById("upload-progress-text");
             new MutationObserver(() => window.reportUploadProgress(words.textContent))
               .observe(words, {childList: true, characterData: true, subtree: true});
           }"""
    )
    page.get_by_label("Frames", exact=True).fill("1-30, 45, 50-60x2")
    page.get_by_label("Samples").fill("16")
    page.get_by_label("Output format").select_option("OPEN_EXR")
    page.get_by_label("Scene (.blend, or a .zip with its assets)").set_input_files(
        files={"name": "shot.blend", "mimeType": "application/octet-stream", "buffer": a_big_blend()}
    )
    page.get_by_role("button", name="Upload and check").click()

    expect(page.get_by_role("heading", level=1)).to_have_text("shot.blend")
    # A checked upload goes straight to the probe: the page says so and polls for the estimate. This made-up
    # scene fails its probe wherever a render worker reads the run's queue (an earlier browser test's may,
    # and may already have): then the page says the job failed, and why.
    expect(page.get_by_test_id("state")).to_have_text(re.compile(r"^(Estimating|Failed)$"))
    waiting = page.get_by_test_id("estimating").filter(has_text="the estimate shows here when it is ready")
    expect(waiting.or_(page.get_by_test_id("failure"))).to_be_visible()
    assert any(text.startswith("Uploaded 3.0 MiB") for text in seen), seen
    page.screenshot(path=str(SCREENSHOTS / "render-job-checked.png"), full_page=True)
    watch.assert_clean("the job's page after the upload")

    page.get_by_role("link", name="← Render jobs").click()
    row = page.get_by_test_id("render-job").filter(has_text="shot.blend")
    # This made-up scene fails its probe wherever a render worker reads the run's queue; none may.
    expect(row.get_by_test_id("state")).to_have_text(re.compile(r"^(Estimating|Failed)$"))
    expect(row).to_contain_text("37")
    expect(row.get_by_test_id("progress")).to_have_text(re.compile(r"^(estimating|—)$"))
    page.screenshot(path=str(SCREENSHOTS / "render-jobs-listed.png"), full_page=True)

    job = RenderJob.objects.get()
    assert (job.owner, job.frame_count, job.samples, job.output_format) == (alice, 37, 16, "OPEN_EXR")
    # The whole file arrived: its size as stored, once the hash the page sent matched (a failed probe has
    # removed the file itself meanwhile, where an estimate worker of an earlier test read the run's queue).
    assert job.upload_bytes == len(a_big_blend())
    jobs.remove_files(job)
    assert not job.folder_path().exists()


def test_an_image_named_blend_comes_back_on_the_form_in_words(
    portal_server: str, page: Page, alice: User, render_fleet: None
) -> None:
    log_in(page, portal_server, "alice")
    page.goto(portal_server + "/sessions/render-jobs/")
    page.get_by_label("Frames", exact=True).fill("1-3")
    page.get_by_label("Scene (.blend, or a .zip with its assets)").set_input_files(
        files={"name": "photo.blend", "mimeType": "application/octet-stream", "buffer": scenes.PNG}
    )
    page.get_by_role("button", name="Upload and check").click()
    expect(page.get_by_test_id("scene-error")).to_have_text("'photo.blend' is not a Blender file: it is a PNG image.")
    expect(page.get_by_label("Frames", exact=True)).to_have_value("1-3")
    assert not RenderJob.objects.exists()
    page.screenshot(path=str(SCREENSHOTS / "render-upload-refused.png"), full_page=True)


def test_a_zip_with_several_scenes_asks_which_one_with_each_choice_beside_its_button(
    portal_server: str, page: Page, alice: User, render_fleet: None
) -> None:
    watch = PageWatch.on(page)
    log_in(page, portal_server, "alice")
    page.goto(portal_server + "/sessions/render-jobs/")
    page.get_by_label("Frames", exact=True).fill("1-2")
    two = scenes.zip_of(("a.blend", scenes.blend()), ("shots/main.blend", scenes.zstd_blend("402")))
    page.get_by_label("Scene (.blend, or a .zip with its assets)").set_input_files(
        files={"name": "two.zip", "mimeType": "application/zip", "buffer": two}
    )
    page.get_by_role("button", name="Upload and check").click()

    expect(page.get_by_test_id("next-step")).to_contain_text("Say which one is the scene")
    choice = page.get_by_label("shots/main.blend")
    # Each button sits on its choice's line, just left of its name (the form's inputs are page-wide).
    button, label = choice.bounding_box(), page.locator("label", has=choice).bounding_box()
    assert button and label and button["width"] < 40, button
    assert label["x"] <= button["x"] < label["x"] + 40 and label["y"] <= button["y"] <= label["y"] + label["height"]
    page.screenshot(path=str(SCREENSHOTS / "render-main-file-choice.png"), full_page=True)
    choice.check()
    page.get_by_role("button", name="Use this file").click()

    expect(page.get_by_test_id("state")).to_have_text(re.compile(r"^(Estimating|Failed)$"))
    job = RenderJob.objects.get()
    assert job.main_file == "shots/main.blend"
    watch.assert_clean("the main file's choice")
    jobs.remove_files(job)


def test_a_job_being_unpacked_shows_a_bar_that_follows_its_task_then_what_came_of_it(
    portal_server: str, page: Page, alice: User, render_fleet: None
) -> None:
    from django.core.cache import cache

    from sessions.render import unpacking
    from tests.render.stack import make_job, state_of

    watch = PageWatch.on(page)
    job = make_job(alice, Path(__file__), [1], RenderJob.State.UNPACKING, unpack_heard_at=timezone.now())
    key = unpacking.progress_key(job.pk)
    cache.set(key, {"phase": "Unpacking", "done": 1 << 20, "total": 4 << 20}, 60)
    log_in(page, portal_server, "alice")
    page.goto(f"{portal_server}/sessions/render-jobs/{job.pk}/")
    bar = page.get_by_test_id("unpacking").locator("progress")
    expect(bar).to_have_attribute("value", "25")
    cache.set(key, {"phase": "Unpacking", "done": 3 << 20, "total": 4 << 20}, 60)
    expect(bar).to_have_attribute("value", "75")  # the region polls every second
    expect(page.get_by_test_id("unpacking")).to_contain_text("Unpacking: 3.0 MB of 4.0 MB")
    page.screenshot(path=str(SCREENSHOTS / "render-job-unpacking.png"), full_page=True)
    with transaction.atomic():
        locked = RenderJob.objects.select_for_update().get(pk=job.pk)
        locked.save(update_fields=locked.move(RenderJob.State.FAILED, "'x.blend' is incomplete."))
    expect(page.get_by_test_id("failure")).to_have_text("'x.blend' is incomplete.")  # the page loaded again
    assert state_of(job) == "failed"
    watch.assert_clean("the job's page while it unpacks")
    jobs.remove_files(job)
