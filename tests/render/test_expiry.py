"""Unfinished jobs expire: one left ``uploaded`` (its main file never chosen) or ``awaiting confirmation`` (its
estimate never confirmed) for PORTAL_RENDER_UNFINISHED_EXPIRY_HOURS is cancelled by the hourly retention task,
its files removed and its share of the quota freed, its page saying why; a younger one, one that moved on and
one in any other state are left alone."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from sessions.render import jobs, retention, tasks
from sessions.render import storage as render_storage
from sessions.render.models import RenderJob
from sessions.storage import usage
from tests.render.test_quota import a_job_with_files

pytestmark = pytest.mark.django_db
State = RenderJob.State
HOURS = 48


@pytest.fixture(autouse=True)
def expiry(settings) -> None:  # type: ignore[no-untyped-def]
    settings.RENDER_UNFINISHED_EXPIRY_HOURS = HOURS


def left_since(job: RenderJob, hours: float) -> RenderJob:
    RenderJob.objects.filter(pk=job.pk).update(state_since=timezone.now() - timedelta(hours=hours))
    render_storage.measure_job(job)
    return job


def page_of(client: Client, job: RenderJob) -> str:
    return " ".join(strip_tags(client.get(reverse("render-job-detail", args=[job.pk])).content.decode()).split())


def test_a_job_whose_main_file_was_never_chosen_is_cancelled_by_the_hourly_task_and_its_files_removed(
    alice: User, alice_client: Client, render_dir: Path
) -> None:
    job = left_since(a_job_with_files(alice, State.UPLOADED, blend_files=["a.blend", "b.blend"]), HOURS + 1)

    assert tasks.remove_expired_render_files() == 1

    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.files_removed_at is not None and job.finished_at is not None
    assert not job.folder_path().exists() and usage.used_by(alice.pk) == 0
    assert (
        "Cancelled by the portal: its main file was not chosen within 2 days, so its files were removed. "
        "Upload the scene again to render it." in page_of(alice_client, job)
    )


def test_a_job_whose_estimate_was_never_confirmed_is_cancelled_and_its_files_removed(
    alice: User, alice_client: Client, render_dir: Path
) -> None:
    job = left_since(a_job_with_files(alice, State.AWAITING_CONFIRMATION), HOURS + 1)

    assert retention.expire_unfinished() == 1

    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.files_removed_at is not None
    assert not job.folder_path().exists() and usage.used_by(alice.pk) == 0
    assert (
        "Cancelled by the portal: its estimate was not confirmed within 2 days, so its files were removed. "
        "Upload the scene again to render it." in page_of(alice_client, job)
    )
    assert retention.expire_unfinished() == 0, "a run repeated removes nothing more"


def test_younger_unfinished_jobs_and_jobs_in_other_states_are_left_alone(alice: User, render_dir: Path) -> None:
    young = [
        left_since(a_job_with_files(alice, State.UPLOADED), HOURS - 1),
        left_since(a_job_with_files(alice, State.AWAITING_CONFIRMATION), HOURS - 1),
    ]
    other = [
        left_since(a_job_with_files(alice, state), HOURS * 10)
        for state in (State.UNPACKING, State.VALIDATED, State.ESTIMATING, State.QUEUED, State.RENDERING, State.FAILED)
    ]

    assert retention.expire_unfinished() == 0

    for job in young + other:
        before = job.state
        job.refresh_from_db()
        assert job.state == before and job.files_removed_at is None and job.folder_path().exists()


def test_each_step_starts_the_wait_again(alice: User, render_dir: Path) -> None:
    """A job estimated again (its owner asked) waits a whole expiry again for its confirmation."""
    job = left_since(a_job_with_files(alice, State.AWAITING_CONFIRMATION), HOURS + 1)
    jobs.move(job.pk, State.ESTIMATING)
    jobs.move(job.pk, State.AWAITING_CONFIRMATION)

    assert retention.expire_unfinished() == 0
    assert retention.expire_unfinished(timezone.now() + timedelta(hours=HOURS + 1)) == 1
