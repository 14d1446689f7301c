# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""The issue's browser test, on the real render stack: in Chromium a person uploads a scene Blender made,
sees its estimate (the probe ran in the sandbox), confirms it, watches the progress region fill from the
websocket up to 100 %, sees the gallery's thumbnails (sent by the portal from the folder the worker wrote)
and downloads the ZIP with every frame's PNG."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from sessions.gpus import agency
from sessions.render.models import RenderFrame, RenderJob
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.helpers.page_watch import PageWatch
from tests.render.stack import (  # noqa: F401 (fixtures)
    MIG_OFFER,
    render_image,
    render_portal_server,
    render_root,
    render_stack,
    render_worker,
    scenes,
    slices_of,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State
OFFER = f"mig:{MIG_OFFER['gpu_model']}:{MIG_OFFER['gpu_profile']}"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_LOADED = """() => {
  const shown = Array.from(document.querySelectorAll('[data-testid="gallery"] img'));
  return shown.length === 3 && shown.every((img) => img.complete && img.naturalWidth > 0);
}"""

# Records what the jobs list's row of the job shows as it changes: its state, bar and frames done.
WATCH_ROW = """(id) => {
  const report = () => {
    const row = document.getElementById(id);
    if (!row) { return; }
    const bar = row.querySelector('progress[data-field="percent"]');
    const done = row.querySelector('[data-field="frames_done"]');
    window.reportRow([row.getAttribute("data-state"), bar ? bar.value : "", done ? done.textContent : ""].join("|"));
  };
  new MutationObserver(report).observe(document.querySelector(".render-layout"),
    {attributes: true, childList: true, characterData: true, subtree: true});
}"""

# Records what the socket writes into the progress region, at each change: the bar's value, the frames done,
# the samples and the state badge at the top (kept in the page too, so a wait can look for a moment that passed).
WATCH_PROGRESS = """() => {
  const region = document.querySelector("[data-render-progress]");
  const bar = region.querySelector('progress[data-field="percent"]');
  const done = region.querySelector('[data-field="frames_done"]');
  const samples = region.querySelector('[data-field="samples"]');
  const badge = document.querySelector("[data-render-badge]");
  window.progressSeen = [];
  const report = () => {
    const words = [bar.getAttribute("value"), done.textContent, samples.textContent, badge.textContent.trim()];
    window.progressSeen.push(words.join("|"));
    window.reportProgress(words.join("|"));
  };
  const all = {attributes: true, childList: true, characterData: true, subtree: true};
  new MutationObserver(report).observe(document.body, all);
}"""
# While it rendered, the socket showed the job's samples (only the socket carries them: the page as served shows
# a dash there) with the badge at the top saying so.
SAW_IT_RENDER = """() => (window.progressSeen || []).some((words) => words.endsWith("|1500|Rendering"))"""


def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.bring_to_front()  # Chromium paints no background tab: a screenshot of one waits forever
    page.screenshot(path=str(SCREENSHOTS / f"render-flow-{name}.png"), full_page=True)


@pytest.mark.timeout(900)  # the probe, then three frames, in containers
def test_a_scene_uploaded_in_the_browser_is_estimated_confirmed_rendered_shown_and_downloaded(
    render_stack: Path, scenes: Path, render_portal_server: str, page: Page, alice: User
) -> None:
    base = render_portal_server
    watch = PageWatch.on(page)
    log_in(page, base, "alice")
    page.goto(base + "/sessions/render-jobs/")
    page.get_by_label("Frames", exact=True).fill("1-3")
    page.get_by_label("GPU slice").select_option(OFFER)
    page.get_by_label("Frames per chunk").fill("3")
    # Enough samples that the frames take seconds (the scene's own 4 take a fraction of one): the page's socket
    # must be open while Blender samples, or no sample line can reach it.
    page.get_by_label("Samples").fill("1500")
    page.get_by_label("Scene (.blend, or a .zip with its assets)").set_input_files(str(scenes / "small.blend"))
    shot(page, "1-upload-form")
    page.get_by_role("button", name="Upload and check").click()

    # The probe renders a frame in the sandbox on the render worker; the page polls, then shows the estimate.
    expect(page.get_by_role("heading", level=1)).to_have_text("small.blend")
    estimate = page.get_by_test_id("estimate")
    expect(estimate).to_be_visible(timeout=180_000)
    expect(estimate).to_contain_text("64 × 48 at 100 %")
    expect(estimate).to_contain_text("CYCLES")
    expect(page.get_by_test_id("device")).to_have_text("CPU")
    expect(page.get_by_test_id("total-time")).to_have_text(re.compile(r"^[\d.]+ s for 3 frames in 1 chunk on 1 slice$"))
    job = RenderJob.objects.get(owner=alice, upload_name="small.blend")
    assert job.state == State.AWAITING_CONFIRMATION
    shot(page, "2-estimate")

    seen: list[str] = []
    # The chunk's slice waits for its MIG instance, which this process makes as its host's agent: it is made
    # only once both pages listen, so no sample line can pass before (a fast machine renders these frames in a
    # second). The order waits well inside its deadline (PORTAL_HOST_ORDER_DEADLINE_S).
    agency.stop_acting_for([agency.EVERY_HOST])
    try:
        page.get_by_role("button", name="Confirm and render").click()
        region = page.locator(f'[data-render-progress="/ws/render/{job.pk}/"]')
        expect(region).to_be_visible()
        page.expose_function("reportProgress", lambda words: seen.append(words))
        page.evaluate(WATCH_PROGRESS)
        # Beside it, the jobs list in another tab: the job's row follows it over /ws/render/.
        listed, rows_seen = page.context.new_page(), []
        listed_watch = PageWatch.on(listed)
        listed.goto(base + "/sessions/render-jobs/")
        listed.expose_function("reportRow", lambda words: rows_seen.append(words))
        listed.evaluate(WATCH_ROW, f"render-job-{job.pk}")
    finally:
        agency.act_for([agency.EVERY_HOST])
    page.wait_for_function(SAW_IT_RENDER, timeout=180_000)
    shot(page, "3-rendering")

    # Once the job is done the page loads again with the gallery; before that the socket showed 3 of 3.
    gallery = page.get_by_test_id("gallery")
    expect(gallery).to_be_visible(timeout=240_000)
    assert any(words.startswith("100|3|") for words in seen), seen
    expect(page.get_by_test_id("state")).to_have_text("Done")
    expect(region.locator('progress[data-field="percent"]')).to_have_attribute("value", "100")
    expect(page.get_by_test_id("frames-done")).to_have_text("3 of 3 frames")
    thumbnails = gallery.get_by_role("img")
    expect(thumbnails).to_have_count(3)
    for index in range(3):
        expect(thumbnails.nth(index)).to_have_attribute("alt", f"Frame {index + 1}")
    # A thumbnail the browser fetched and decoded has a width; a broken one (not in the folder daphne reads)
    # has none. They load lazily: the gallery is scrolled to first.
    gallery.scroll_into_view_if_needed()
    page.wait_for_function(ALL_LOADED, timeout=30_000)
    shot(page, "4-gallery")

    with page.expect_download() as caught:
        page.get_by_role("link", name="Download all 3 frames (ZIP)").click()
    download = caught.value
    assert download.suggested_filename == f"render-job-{job.pk}-frames.zip"
    archive = zipfile.ZipFile(io.BytesIO(Path(download.path()).read_bytes()))
    names = sorted(archive.namelist())
    assert names == [f"job{job.pk}-frame{n:04d}.png" for n in (1, 2, 3)]
    for name in names:
        assert archive.read(name).startswith(PNG_MAGIC), name
    assert archive.testzip() is None
    shot(page, "5-downloaded")

    # The list in the other tab followed it to the end without a reload of ours: frames done in place while
    # it rendered, then the row again once it was done.
    live_row = listed.locator(f"#render-job-{job.pk}")
    expect(live_row.get_by_test_id("state")).to_have_text("Done")
    expect(live_row.get_by_test_id("progress")).to_have_text(re.compile(r"100 %\s+3 of 3"))
    assert any(re.fullmatch(r"rendering\|\d+\|[123]", words) for words in rows_seen), rows_seen
    assert rows_seen[-1] == "done|100|3", rows_seen
    shot(listed, "6-listed-live")
    listed_watch.assert_clean("the jobs list following the job")
    listed.close()
    page.bring_to_front()

    # The jobs list shows it done, with what it cost so far (the probe's minutes are the probe's own).
    page.get_by_role("link", name="← Render jobs").click()
    row = page.get_by_test_id("render-job").filter(has_text="small.blend")
    expect(row.get_by_test_id("state")).to_have_text("Done")
    expect(row.locator('progress[data-field="percent"]')).to_have_attribute("value", "100")
    expect(row.get_by_test_id("cost")).to_have_text(re.compile(r"^\d+\.\d\d \w+$"))
    shot(page, "6-listed")

    job.refresh_from_db()
    assert job.state == State.DONE
    assert job.frame_results.filter(state=RenderFrame.State.DONE).count() == 3
    held = slices_of(job)
    assert held, "the job held a slice"
    wait_for(lambda: all(taken.released_at for taken in slices_of(job)), 30, "its slices released")
    watch.assert_clean("the render flow's pages")
