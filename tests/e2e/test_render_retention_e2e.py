"""Render jobs whose files were removed by retention, in Chromium: the jobs list and the job's page say when
the files went and how long they were kept, and show no broken thumbnail or download; a younger finished
job's page says until when its files are kept."""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from sessions.render import retention
from sessions.render.models import RenderFrame, RenderJob
from tests.e2e.conftest import SCREENSHOTS, log_in
from tests.helpers.page_watch import PageWatch

pytestmark = pytest.mark.django_db(transaction=True)
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def finished(owner: User, name: str, days_ago: int) -> RenderJob:
    job = RenderJob.objects.create(
        owner=owner, state=RenderJob.State.DONE, upload_name=name, folder=f"u{owner.pk}/{secrets.token_hex(16)}",
        main_file="scene.blend", frame_spec="1", frames=[1], frame_count=1, gpu_kind="mig", gpu_profile="1g.18gb",
        gpu_model="H200-SXM5-141GB", queued_at=timezone.now() - timedelta(days=days_ago, hours=1),
        finished_at=timezone.now() - timedelta(days=days_ago),
    )  # fmt: skip
    (job.folder_path() / "frames").mkdir(parents=True)
    (job.folder_path() / "frames" / "frame_0001.png").write_bytes(PNG)
    RenderFrame.objects.create(job=job, number=1, state="done", output_path="frames/frame_0001.png")
    return job


def test_a_job_whose_files_were_removed_says_so_on_the_list_and_its_page(
    portal_server: str, page: Page, alice: User
) -> None:
    old = finished(alice, "old-shot.blend", days_ago=settings.RENDER_RETENTION_DAYS + 3)
    young = finished(alice, "young-shot.blend", days_ago=1)
    assert retention.remove_expired_files() == 1
    assert not Path(old.folder_path()).exists() and Path(young.folder_path()).exists()
    watch = PageWatch.on(page)
    log_in(page, portal_server, "alice")

    page.goto(f"{portal_server}/sessions/render-jobs/")
    row = page.locator(f"#render-job-{old.pk}")
    expect(row.get_by_test_id("files-removed")).to_contain_text(
        f"files removed on {timezone.localtime():%-d %b %Y} (kept {settings.RENDER_RETENTION_DAYS + 3} days)"
    )
    expect(page.locator(f"#render-job-{young.pk}").get_by_test_id("files-removed")).to_have_count(0)
    page.screenshot(path=str(SCREENSHOTS / "render-jobs-files-removed.png"), full_page=True)

    page.goto(f"{portal_server}/sessions/render-jobs/{old.pk}/")
    expect(page.get_by_test_id("files-removed")).to_contain_text("this record and its charges are kept")
    expect(page.get_by_test_id("gallery")).to_have_count(0)
    expect(page.get_by_role("link", name="Download all")).to_have_count(0)
    page.screenshot(path=str(SCREENSHOTS / "render-job-files-removed.png"), full_page=True)

    page.goto(f"{portal_server}/sessions/render-jobs/{young.pk}/")
    expect(page.get_by_test_id("files-kept")).to_contain_text("kept until")
    expect(page.get_by_test_id("gallery")).to_be_visible()
    watch.assert_clean("the render pages of jobs with and without their files")
