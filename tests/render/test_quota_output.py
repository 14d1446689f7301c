# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A chunk's output counts toward its owner's storage quota, on the real stack (Blender in its container, the
output watchdog): a run that would pass what is left of the quota is stopped and fails the job at once, saying
so, with no retry, its slice released and nothing but finished frames kept; a chunk of a person whose quota is
already used up fails without a container started (nothing to charge). The job's share is measured again after
each run."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from pytest_django.fixtures import Settings

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.render import chunks
from sessions.render import storage as render_storage
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.storage import usage
from sessions.storage.models import StorageUse
from tests.render.stack import (  # noqa: F401 (fixtures)
    containers_of,
    make_job,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    slices_of,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State
KIB = 1024


def queued(owner: User, scene: Path, frames: list[int], **fields: object) -> tuple[RenderJob, RenderChunk, int]:
    job = make_job(owner, scene, frames, State.QUEUED, chunk_size=len(frames), **fields)
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in frames])
    chunk = RenderChunk.objects.create(job=job, index=0, frames=frames)
    held = allocate(owner, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))
    render_storage.measure_job(job)
    return job, chunk, held.pk


def test_a_chunk_that_would_pass_its_owners_quota_is_stopped_and_fails_the_job_saying_so(
    render_stack: Path, scenes: Path, alice: User, settings: Settings
) -> None:
    settings.RENDER_MAX_OUTPUT_BYTES = 20 * 1024**3  # the setting is no bound here: the quota is
    settings.RENDER_CHUNK_ATTEMPTS = 3
    job, chunk, held = queued(alice, scenes / "slow.blend", [1, 2, 3], samples=64)
    # What is left is less than one 320 x 240 PNG: the first frame passes it, and the next takes seconds.
    settings.STORAGE_QUOTA_BYTES = usage.used_by(alice.pk) + 16 * KIB

    assert chunks.work_on_slice(job.pk, held) == 1

    job.refresh_from_db()
    chunk.refresh_from_db()
    assert job.state == State.FAILED
    assert "would pass your storage quota" in job.failure_message, job.failure_message
    assert "it was stopped at 16 KiB, what was left of your quota" in job.failure_message
    assert "remove what you no longer need" in job.failure_message
    assert "queue the frames that are not done again" in job.failure_message
    assert (chunk.state, chunk.attempts) == (RenderChunk.State.FAILED, 1), "no retry burns more money"
    [taken] = slices_of(job)
    assert taken.released_at is not None and containers_of(job) == []
    done = RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE)
    kept = {job.folder_path() / frame.output_path for frame in done}
    assert set(chunks.output_folder(job, chunk).iterdir()) == kept, "only finished frames stay"
    measured = StorageUse.objects.get(kind=StorageUse.Kind.RENDER_JOB, key=str(job.pk))
    assert measured.parts["frames"] > 0, "measured again after the run"


def test_a_chunk_of_a_person_whose_quota_is_used_up_fails_without_starting_a_container(
    render_stack: Path, scenes: Path, alice: User, settings: Settings
) -> None:
    job, chunk, held = queued(alice, scenes / "slow.blend", [1, 2])
    settings.STORAGE_QUOTA_BYTES = usage.used_by(alice.pk)  # the scene alone fills it

    assert chunks.work_on_slice(job.pk, held) == 1

    job.refresh_from_db()
    chunk.refresh_from_db()
    assert job.state == State.FAILED and "would pass your storage quota" in job.failure_message
    [taken] = slices_of(job)
    assert taken.released_at is not None
    assert taken.held_from is None, "no container started: nothing held, nothing charged"
    assert not RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE).exists()
