"""A person's storage in Chromium: the Render jobs page shows used of quota with a bar and each thing that uses
it (a job's scene and frames, an upload on its way, the notebook work folder), and removing an ended job's files
from there frees its share; the Sessions page shows the same section, full, saying new sessions are refused."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from playwright.sync_api import Page, expect

from sessions.render import storage as render_storage
from sessions.render.models import RenderJob
from sessions.storage import usage
from sessions.storage.models import StorageQuota, StorageUse
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.helpers.page_watch import PageWatch
from tests.render.test_quota import a_job_with_files

pytestmark = pytest.mark.django_db(transaction=True)
Kind = StorageUse.Kind
MIB = 1024**2


def test_removing_an_ended_jobs_files_from_the_storage_section_frees_its_share(
    portal_server: str, page: Page, alice: User
) -> None:
    StorageQuota.objects.create(user=alice, gib=Decimal("0.01"))  # 10.24 MiB
    done = a_job_with_files(alice, RenderJob.State.DONE, frame_bytes=4 * MIB)
    waiting = a_job_with_files(alice, RenderJob.State.AWAITING_CONFIRMATION)
    for job in (done, waiting):
        render_storage.measure_job(job)
    usage.record(alice.pk, Kind.WORK_VOLUME, "vol", label="work/", size=3 * MIB, url=reverse("session-list"))
    watch = PageWatch.on(page)
    log_in(page, portal_server, "alice")

    page.goto(f"{portal_server}/sessions/render-jobs/")
    section = page.locator("#storage")
    expect(section.get_by_test_id("storage-used")).to_have_text("7.08 MiB")
    expect(section.locator("progress")).to_have_attribute("value", "69")
    expect(section.get_by_test_id("storage-use")).to_have_count(3)
    expect(section.get_by_test_id("storage-use").first).to_contain_text("scene 20 KiB, frames 4.02 MiB")
    page.screenshot(path=str(SCREENSHOTS / "render-storage-section.png"), full_page=True)

    section.get_by_role("button", name="Remove the files of shot.blend: its scene and frames").click()

    expect(page.get_by_role("status").filter(has_text="are removed")).to_be_visible()
    expect(page.locator("#storage").get_by_test_id("storage-use")).to_have_count(2)
    expect(page.locator("#storage").get_by_test_id("storage-used")).to_have_text("3.04 MiB")
    assert not done.folder_path().exists() and waiting.folder_path().exists()
    watch.assert_clean("the render page's storage section, and removing a job's files from it")


def test_the_sessions_page_shows_a_full_quota_and_refuses_new_sessions_in_words(
    portal_server: str, page: Page, alice: User
) -> None:
    StorageQuota.objects.create(user=alice, gib=Decimal("0.01"))
    usage.record(alice.pk, Kind.WORK_VOLUME, "vol", label="work/", size=11 * MIB, url=reverse("session-list"))
    log_in(page, portal_server, "alice")

    page.goto(f"{portal_server}/sessions/")

    section = page.locator("#storage")
    expect(section.get_by_test_id("storage-full")).to_contain_text("notebook sessions are refused")
    expect(section.locator("progress")).to_have_attribute("value", "100")
    page.screenshot(path=str(SCREENSHOTS / "sessions-storage-full.png"), full_page=True)
