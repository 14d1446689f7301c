"""Retention of render jobs' files: an ended job's folder goes PORTAL_RENDER_RETENTION_DAYS after it ended,
its record (job, chunks, frames, slices) and every charge (usages, minutes, ledger) stay; a younger job and
one that has not ended keep theirs; no link is followed; two runs at once remove each folder once; the pages
say the files were removed, and the frame, thumbnail and ZIP addresses answer 410 with words."""

from __future__ import annotations

import secrets
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from billing import ledger, meter, seeds
from billing.models import ChargedMinute, Entry, Price, Usage
from portal.celery import app
from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest, allocate, release
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.render import retention, services, tasks
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.billing.conftest import ledger_total, unbalanced_transactions

pytestmark = pytest.mark.django_db
State = RenderJob.State
RETENTION_DAYS = 30
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
JPEG = b"\xff\xd8\xff" + b"\x00" * 64


@pytest.fixture(autouse=True)
def retention_days(settings) -> None:  # type: ignore[no-untyped-def]
    settings.RENDER_RETENTION_DAYS = RETENTION_DAYS


def a_job(owner: User, state: State, ended_days_ago: float | None, **fields: object) -> RenderJob:
    """A job with what a render leaves on disk: its scene, an estimate, one frame and its thumbnail."""
    finished = None if ended_days_ago is None else timezone.now() - timedelta(days=ended_days_ago)
    job = RenderJob.objects.create(
        owner=owner, state=state, upload_name="shot.blend", folder=f"u{owner.pk}/{secrets.token_hex(16)}",
        main_file="scene.blend", frame_spec="1", frames=[1], frame_count=1, gpu_kind="mig",
        gpu_profile="1g.18gb", gpu_model="H200-SXM5-141GB", finished_at=finished,
        queued_at=timezone.now() - timedelta(days=60), **fields,
    )  # fmt: skip
    folder = job.folder_path()
    (folder / "scene").mkdir(parents=True)
    (folder / "scene" / "scene.blend").write_bytes(b"BLENDER-v304")
    (folder / "frames" / "chunk0-1").mkdir(parents=True)
    (folder / "frames" / "chunk0-1" / "frame_0001.png").write_bytes(PNG)
    (folder / "thumbnails").mkdir()
    (folder / "thumbnails" / "frame_0001.jpg").write_bytes(JPEG)
    (folder / services.ESTIMATE_FILE).write_text("{}")
    RenderChunk.objects.create(job=job, index=0, frames=[1], state="done", attempts=1, log_excerpt="Fra:1 ...")
    RenderFrame.objects.create(
        job=job, number=1, state="done", output_path="frames/chunk0-1/frame_0001.png",
        thumbnail_path="thumbnails/frame_0001.jpg", finished_at=finished,
    )  # fmt: skip
    return job


def billed(job: RenderJob) -> Slice:
    """A slice the job held for three minutes, released and charged by the meter."""
    held = allocate(job.owner, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))
    began = timezone.now() - timedelta(hours=1)
    holdings.ended(held.pk, began, began + timedelta(minutes=3))
    release(held.pk)
    meter.charge_holding(held.pk)
    return held


def records() -> dict[str, int]:
    models = {"jobs": RenderJob, "chunks": RenderChunk, "frames": RenderFrame, "slices": Slice}
    billing = {"usages": Usage, "minutes": ChargedMinute, "entries": Entry}
    return {name: model.objects.count() for name, model in {**models, **billing}.items()}  # type: ignore[attr-defined]


def test_an_ended_job_past_retention_loses_its_files_and_keeps_its_record_and_charges(
    alice: User, render_dir: Path, fleet: None
) -> None:
    seeds.ensure(Price)
    old = a_job(alice, State.DONE, ended_days_ago=RETENTION_DAYS + 1)
    young = a_job(alice, State.DONE, ended_days_ago=RETENTION_DAYS - 1)
    running = a_job(alice, State.RENDERING, ended_days_ago=None)
    requeued = a_job(alice, State.QUEUED, ended_days_ago=None, failure_message="")
    held = billed(old)
    assert ChargedMinute.objects.filter(usage__slice=held).count() == 3
    before, balance = records(), ledger.balance(alice)

    assert retention.remove_expired_files() == 1

    old.refresh_from_db()
    assert not old.folder_path().exists()
    assert old.files_removed_at is not None and old.state == State.DONE
    for kept in (young, running, requeued):
        assert (kept.scene_path() / "scene.blend").is_file() and (kept.folder_path() / "thumbnails").is_dir()
        kept.refresh_from_db()
        assert kept.files_removed_at is None
    assert records() == before, "every row stays: job, chunks, frames, slices, usages, minutes, ledger"
    assert ledger.balance(alice) == balance and ledger_total() == 0 and unbalanced_transactions() == []
    assert retention.remove_expired_files() == 0, "once is enough"


def test_the_pages_say_the_files_were_removed_and_their_addresses_answer_410_with_words(
    alice: User, alice_client: Client, bob: User, render_dir: Path
) -> None:
    job = a_job(alice, State.FAILED, ended_days_ago=RETENTION_DAYS + 5)
    assert retention.remove_expired_files() == 1
    job.refresh_from_db()
    assert job.files_kept_days == RETENTION_DAYS + 5

    page = alice_client.get(reverse("render-job-detail", args=[job.pk])).content.decode()
    removed_on = f"{timezone.localtime(job.files_removed_at):%-d %b %Y}"
    assert f"removed on {removed_on}" in strip_tags(page) and f"kept {RETENTION_DAYS + 5} days" in page
    assert reverse("render-frame-thumbnail", args=[job.pk, 1]) not in page, "no broken thumbnails"
    assert reverse("render-frames-zip", args=[job.pk]) not in page
    assert reverse("render-job-requeue-failed", args=[job.pk]) not in page
    listed = alice_client.get(reverse("render-job-list")).content.decode()
    assert f"files removed on {removed_on}" in listed
    for url in (
        reverse("render-frame-thumbnail", args=[job.pk, 1]),
        reverse("render-frame-download", args=[job.pk, 1]),
        reverse("render-frames-zip", args=[job.pk]),
    ):
        gone = alice_client.get(url)
        assert gone.status_code == 410, url
        words = gone.content.decode()
        assert f"kept {RETENTION_DAYS + 5} days" in words and "charges are kept" in words
    refused = alice_client.post(reverse("render-job-requeue-failed", args=[job.pk]))
    assert refused.status_code == 409 and "upload the scene again" in refused.content.decode()
    bob_client = Client()
    bob_client.force_login(bob)
    assert bob_client.get(reverse("render-frames-zip", args=[job.pk])).status_code == 404, "404 before 410"


def test_a_finished_jobs_page_says_until_when_its_files_are_kept(
    alice: User, alice_client: Client, render_dir: Path
) -> None:
    job = a_job(alice, State.DONE, ended_days_ago=2)
    page = strip_tags(alice_client.get(reverse("render-job-detail", args=[job.pk])).content.decode())
    assert job.finished_at is not None
    until = job.finished_at + timedelta(days=RETENTION_DAYS)
    assert f"kept until {timezone.localtime(until):%-d %b %Y}" in page


def test_removal_follows_no_link_out_of_the_job_folder(alice: User, render_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    job = a_job(alice, State.CANCELLED, ended_days_ago=RETENTION_DAYS + 1)
    (job.folder_path() / "frames" / "chunk0-1" / "escape").symlink_to(outside)
    (job.folder_path() / "frames" / "chunk0-1" / "frame_0002.png").symlink_to(outside / "precious.txt")
    linked = a_job(alice, State.DONE, ended_days_ago=RETENTION_DAYS + 1)
    # Its folder reached through a link to a folder outside the render folder: left alone, reported.
    real = tmp_path / "elsewhere"
    linked.folder_path().rename(real)
    linked.folder_path().symlink_to(real)

    assert retention.remove_expired_files() == 1

    assert (outside / "precious.txt").read_text() == "keep me"
    assert not job.folder_path().exists()
    assert (real / "scene" / "scene.blend").is_file()
    linked.refresh_from_db()
    assert linked.files_removed_at is None


@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_remove_each_folder_once(alice: User, render_dir: Path) -> None:
    expired = [a_job(alice, State.DONE, ended_days_ago=RETENTION_DAYS + n) for n in range(1, 9)]
    start, counts = threading.Barrier(2), []

    def run() -> None:
        start.wait()
        try:
            counts.append(retention.remove_expired_files())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sum(counts) == len(expired) and len(counts) == 2
    assert not any(job.folder_path().exists() for job in expired)
    assert RenderJob.objects.filter(files_removed_at__isnull=True).count() == 0


def test_the_hourly_task_removes_what_is_due(alice: User, render_dir: Path) -> None:
    job = a_job(alice, State.DONE, ended_days_ago=RETENTION_DAYS + 1)
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert tasks.remove_expired_render_files.name in scheduled
    assert tasks.remove_expired_render_files() == 1
    assert not job.folder_path().exists()
