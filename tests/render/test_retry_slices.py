"""Where a failed chunk is tried again: on another slice where one is free. These steps are the database's
alone (which chunk a slice's worker takes, which slice is taken or released), so they run without Docker;
tests/render/test_lifecycle_failures.py shows the same on the real stack with Blender failing."""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.render import chunks, recovery
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.gpus.conftest import use_fleet
from tests.render.conftest import waiting_on

pytestmark = pytest.mark.django_db
WHOLE = {"gpu_kind": "whole", "gpu_profile": "", "gpu_model": "A100-SXM4-80GB"}


@pytest.fixture
def two_gpus(settings, render_dir: Path) -> Iterator[None]:  # type: ignore[no-untyped-def]
    use_fleet(settings, "r: 2xA100-80GB:whole")
    yield
    get_backend.cache_clear()


@pytest.fixture
def one_gpu(settings, render_dir: Path) -> Iterator[None]:  # type: ignore[no-untyped-def]
    use_fleet(settings, "r: 1xA100-80GB:whole")
    yield
    get_backend.cache_clear()


def rendering_job(owner: User) -> tuple[RenderJob, Slice]:
    """A job rendering on its one slice, its container started there a minute ago."""
    job = RenderJob.objects.create(
        owner=owner,
        state=RenderJob.State.RENDERING,
        upload_name="shot.blend",
        folder=f"t{owner.pk}/{secrets.token_hex(8)}",
        main_file="scene.blend",
        frame_spec="1-2",
        frames=[1, 2],
        frame_count=2,
        chunk_size=2,
        **WHOLE,  # type: ignore[arg-type]
    )
    held = allocate(owner, job.request, holder=Holder.render(job.pk))
    holdings.started(held.pk, timezone.now() - timedelta(minutes=1))
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in (1, 2)])
    return job, held


def failed_once_on(job: RenderJob, held: Slice) -> RenderChunk:
    """The chunk's first attempt failed on ``held``: it waits for its retry, as ``chunks._chunk_ended`` left it."""
    return RenderChunk.objects.create(
        job=job, index=0, frames=[1, 2], state="pending", attempts=1, slice=held, finished_at=timezone.now()
    )


def held_by_job(job: RenderJob) -> list[Slice]:
    return list(Slice.objects.filter(holder_id=job.pk, released_at__isnull=True).order_by("pk"))


def test_a_chunk_that_failed_on_the_jobs_only_slice_moves_to_a_free_one_and_the_old_is_released(
    two_gpus: None,
    alice: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    """Each attempt on a slice other than the last one's: the worker takes a free slice, lets the old one go
    and carries on there. (The job's folder holds no scene, so every attempt fails, without Docker.)"""
    settings.RENDER_CHUNK_ATTEMPTS = 3
    job, held = rendering_job(alice)
    failed_once_on(job, held)

    chunks.work_on_slice(job.pk, held.pk)

    job.refresh_from_db()
    assert job.state == RenderJob.State.FAILED and "failed 3 times" in job.failure_message, job.failure_message
    assert "no scene.blend" in job.failure_message
    tried = list(Slice.objects.filter(holder_id=job.pk).order_by("pk"))
    assert len(tried) == 3 and all(taken.released_at for taken in tried), "one slice per attempt, each let go"
    assert all(earlier.gpu_id != later.gpu_id for earlier, later in itertools.pairwise(tried))
    assert RenderChunk.objects.get(job=job).slice_id == tried[-1].pk
    assert held_by_job(job) == []


def test_where_no_other_slice_is_free_the_chunk_is_tried_again_where_it_failed(one_gpu: None, alice: User) -> None:
    job, held = rendering_job(alice)
    chunk = failed_once_on(job, held)

    claimed = chunks._claim(job.pk, held.pk)

    assert isinstance(claimed, chunks.Claim) and claimed.taken.pk == held.pk
    chunk.refresh_from_db()
    assert (chunk.state, chunk.attempts, chunk.slice_id) == ("rendering", 2, held.pk)
    assert held_by_job(job) == [held]


def test_a_chunk_put_back_after_its_worker_died_renders_again_on_its_own_slice(two_gpus: None, alice: User) -> None:
    """It did not fail: its worker stopped (the render worker restarting), so the slice is kept."""
    job, held = rendering_job(alice)
    chunk = RenderChunk.objects.create(
        job=job, index=0, frames=[1, 2], state="rendering", attempts=1, slice=held, started_at=timezone.now()
    )
    assert recovery.put_back(chunk.pk, count_attempt=False)

    claimed = chunks._claim(job.pk, held.pk)

    assert isinstance(claimed, chunks.Claim) and claimed.taken.pk == held.pk
    assert held_by_job(job) == [held], "no other slice taken"


def test_with_another_of_its_slices_held_the_retry_is_left_to_that_one(two_gpus: None, alice: User) -> None:
    job, held = rendering_job(alice)
    RenderJob.objects.filter(pk=job.pk).update(max_slices=2)
    second = allocate(alice, SliceRequest("whole", "", "A100-SXM4-80GB"), holder=Holder.render(job.pk))
    failed_once_on(job, held)

    assert chunks._claim(job.pk, held.pk) is None, "not retried on the slice it failed on"
    claimed = chunks._claim(job.pk, second.pk)

    assert isinstance(claimed, chunks.Claim) and claimed.taken.pk == second.pk
    assert held_by_job(job) == [held, second], "no third slice taken"


def test_a_retry_moved_to_another_host_s_slice_is_handed_to_that_host_s_render_queue(
    alice: User, quiet_render_queue: str, settings, render_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """Issue 31: the free slice a retry takes is on another host: this machine's worker lets its own slice go
    and sends the new slice's worker to that host's render queue, where that host's render worker takes it."""
    use_fleet(settings, "r: 1xA100-80GB:whole; s: 1xA100-80GB:whole")
    job, held = rendering_job(alice)
    failed_once_on(job, held)

    assert chunks.work_on_slice(job.pk, held.pk) == 0

    moved = held_by_job(job)
    assert [taken.gpu.host.name for taken in moved] == ["s" if held.gpu.host.name == "r" else "r"]
    assert Slice.objects.get(pk=held.pk).released_at is not None
    assert waiting_on(f"{quiet_render_queue}@{moved[0].gpu.host.name}") == [[job.pk, moved[0].pk]]
    assert RenderChunk.objects.get(job=job).state == RenderChunk.State.PENDING, "it waits for that worker"
