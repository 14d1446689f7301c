# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A chunk whose run writes more into its output folder than PORTAL_RENDER_MAX_OUTPUT_BYTES, on the real
stack: the slice's worker runs here (so this test's small limit is the one it reads), Blender renders in a
real container, and the output watchdog stops it. The job fails at once with words that name the limit, no
attempt is repeated, the slice is released with its holding ended, and nothing but finished frames stays."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from pytest_django.fixtures import Settings

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.render import chunks
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
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


def test_a_chunk_writing_past_the_output_limit_is_stopped_and_fails_the_job_without_a_retry(
    render_stack: Path, scenes: Path, alice: User, settings: Settings
) -> None:
    # Less than one 320 x 240 PNG: the first frame passes it, and the next takes seconds to render.
    settings.RENDER_MAX_OUTPUT_BYTES = 16 * 1024
    settings.RENDER_CHUNK_ATTEMPTS = 3
    job = make_job(alice, scenes / "slow.blend", [1, 2, 3], State.QUEUED, chunk_size=3, samples=64)
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in (1, 2, 3)])
    chunk = RenderChunk.objects.create(job=job, index=0, frames=[1, 2, 3])
    held = allocate(alice, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))

    assert chunks.work_on_slice(job.pk, held.pk) == 1

    job.refresh_from_db()
    chunk.refresh_from_db()
    assert job.state == State.FAILED
    assert "PORTAL_RENDER_MAX_OUTPUT_BYTES" in job.failure_message, job.failure_message
    assert "more than 16 KiB into its output folder" in job.failure_message
    assert "not tried again" in job.failure_message
    assert (chunk.state, chunk.attempts) == (RenderChunk.State.FAILED, 1), "no retry burns more money"
    done = RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE)
    assert done.count() < 3 and RenderFrame.objects.filter(job=job, state=RenderFrame.State.FAILED).exists()
    [taken] = slices_of(job)
    assert taken.pk == held.pk and taken.released_at is not None
    assert taken.held_from is not None and taken.held_until is not None
    assert containers_of(job) == []
    run_folder = chunks.output_folder(job, chunk)
    kept = {job.folder_path() / frame.output_path for frame in done}
    assert set(run_folder.iterdir()) == kept, "only finished frames stay in the run's folder"
