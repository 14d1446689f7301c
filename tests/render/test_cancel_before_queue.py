"""Cancelling a job before it is queued, in each state where nothing of it runs: checked (its probe not sent
yet) or awaiting its owner's confirmation (its probe done, its slice released). Its files go at once, the
estimate among them; it holds no slice."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from sessions.render import services
from sessions.render.models import RenderJob
from tests.render import scenes
from tests.render.conftest import stored

pytestmark = pytest.mark.django_db
State = RenderJob.State


def job_on_disk(owner: User, state: State) -> RenderJob:
    job = RenderJob.objects.create(
        owner=owner,
        state=state,
        upload_name="shot.blend",
        folder=f"u{owner.pk}/{secrets.token_hex(16)}",
        main_file="scene.blend",
        frame_spec="1-3",
        frames=[1, 2, 3],
        frame_count=3,
        gpu_kind="mig",
        gpu_profile="1g.18gb",
        gpu_model="H200-SXM5-141GB",
    )
    job.scene_path().mkdir(parents=True)
    (job.scene_path() / "scene.blend").write_bytes(scenes.blend())
    (job.folder_path() / services.ESTIMATE_FILE).write_text("{}")
    return job


@pytest.mark.parametrize("state", [State.VALIDATED, State.AWAITING_CONFIRMATION])
def test_cancelling_a_job_nothing_of_which_runs_removes_its_files_at_once(
    alice: User, alice_client: Client, render_dir: Path, state: State
) -> None:
    job = job_on_disk(alice, state)
    assert stored(render_dir) != []

    answer = alice_client.post(reverse("render-job-cancel", args=[job.pk]))

    assert answer.status_code == 302 and answer["Location"] == reverse("render-job-list")
    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.finished_at is not None
    assert stored(render_dir) == [], "scene and estimate removed"
    assert services.held_by(job.pk) == []
    listed = alice_client.get(reverse("render-job-list")).content.decode()
    assert "its files are removed" in listed
