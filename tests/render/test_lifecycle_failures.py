# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""Render jobs that do not end well, on the real stack: cancelled while a frame renders, a chunk that fails
every attempt, a scene Blender cannot read at the probe, and what reconciliation frees after a crash."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.render import recovery, services, stopping
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.render.leftovers import traces
from tests.render.stack import (  # noqa: F401 (fixtures)
    CHUNK_ATTEMPTS,
    charged_by_the_meter,
    containers_of,
    kill_and_restart_render_worker,
    make_job,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    slices_of,
    state_of,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State


def rendering_on_a_held_slice(job: RenderJob) -> bool:
    return RenderChunk.objects.filter(job=job, state=RenderChunk.State.RENDERING).exists() and any(
        held.held_from for held in slices_of(job)
    )


def test_cancelling_mid_render_stops_the_container_and_ends_the_charges_at_once(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job = make_job(alice, scenes / "slow.blend", [1, 2, 3, 4], State.AWAITING_CONFIRMATION, chunk_size=4)
    services.confirm(job.pk, alice)
    wait_for(lambda: rendering_on_a_held_slice(job), 120, "a chunk rendering on a held slice")
    wait_for(lambda: containers_of(job), 30, "its container")

    stopping.cancel(job.pk)
    cancelled = timezone.now()

    job.refresh_from_db()
    assert job.state == State.CANCELLED
    [held] = slices_of(job)
    assert held.released_at is not None and held.held_until is not None
    assert held.held_from is not None and held.held_from <= held.held_until <= cancelled
    assert not RenderChunk.objects.filter(job=job, state__in=["pending", "rendering"]).exists()
    assert not RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE).exists()
    wait_for(lambda: not containers_of(job), 30, "the job's container removed by its worker")
    with pytest.raises(RenderJob.BadStep, match="already cancelled"):
        stopping.cancel(job.pk)
    charged_by_the_meter(held)  # to the container's end, which came before the cancel returned


def test_a_chunk_that_fails_is_tried_again_on_another_free_slice_then_fails_the_job_with_blenders_words(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job = make_job(alice, scenes / "no-camera.blend", [1, 2], State.AWAITING_CONFIRMATION, chunk_size=2)
    services.confirm(job.pk, alice)
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 180, "the job to end")

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert f"failed {CHUNK_ATTEMPTS} times" in job.failure_message
    assert "camera" in job.failure_message.lower(), job.failure_message  # Blender's own line, in the excerpt
    [chunk] = RenderChunk.objects.filter(job=job)
    assert (chunk.state, chunk.attempts) == (RenderChunk.State.FAILED, CHUNK_ATTEMPTS)
    assert list(RenderFrame.objects.filter(job=job).values_list("state", flat=True)) == ["failed", "failed"]
    wait_for(lambda: all(held.released_at for held in slices_of(job)), 30, "its slices released")
    # The job may hold one slice: each attempt ran on a slice of its own, the one it failed on released.
    tried = slices_of(job)
    assert len(tried) == CHUNK_ATTEMPTS and chunk.slice_id == tried[-1].pk
    assert all(held.held_from and held.held_until for held in tried), "each ran a container, billed to its end"
    ends, starts = [held.held_until for held in tried[:-1]], [held.held_from for held in tried[1:]]
    assert all(end <= start for end, start in zip(ends, starts, strict=True) if end and start), "one after another"
    assert containers_of(job) == []

    requeued = services.requeue_failed(job.pk)
    assert requeued.state == State.QUEUED and requeued.failure_message == ""
    assert list(RenderChunk.objects.filter(job=job).values_list("index", "frames")) == [(0, [1, 2]), (1, [1, 2])]
    wait_for(lambda: state_of(job) == State.FAILED, 180, "the re-queued frames to fail again")
    wait_for(lambda: all(held.released_at for held in slices_of(job)), 30, "every slice released")
    assert len(slices_of(job)) == 2 * CHUNK_ATTEMPTS, "the re-queued frames got slices of their own"


def test_a_scene_blender_cannot_read_fails_at_the_probe_and_only_the_probe_is_billed(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    before = traces(render_stack, docker=True)
    job = make_job(alice, scenes / "unreadable.blend", [1], State.VALIDATED)
    services.request_estimate(job.pk)
    wait_for(lambda: state_of(job) != State.ESTIMATING, 120, "the probe")

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert "could not read" in job.failure_message or "probe render" in job.failure_message
    assert services.estimate_of(job) is None
    [probe_slice] = slices_of(job)
    assert probe_slice.released_at is not None
    assert probe_slice.held_from is not None and probe_slice.held_until is not None
    # Nothing of the job can render again: its scene is gone, and it holds no slice and no container.
    after = traces(render_stack, docker=True)
    assert not job.folder_path().exists()
    assert (after.files, after.held_slices, after.containers) == (before.files, before.held_slices, before.containers)
    charged_by_the_meter(probe_slice)


def test_reconciliation_frees_the_slice_a_crashed_job_left_and_ends_its_holding(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job = make_job(alice, scenes / "small.blend", [1], State.AWAITING_CONFIRMATION)
    RenderJob.objects.filter(pk=job.pk).update(state=State.FAILED, finished_at=timezone.now())
    left = allocate(alice, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))
    began = timezone.now() - timedelta(minutes=3)
    holdings.started(left.pk, began)
    holdings.seen([left.pk], at=began + timedelta(minutes=1))  # its crashed worker's last line

    counts = recovery.reconcile()

    left.refresh_from_db()
    assert counts["slices_released"] == 1
    # No container of it is left to say when it ended: its holding ends at its last proof of life.
    assert left.released_at is not None and left.held_until == began + timedelta(minutes=1)
    assert recovery.reconcile()["slices_released"] == 0


def test_after_a_worker_restart_the_chunk_it_was_rendering_waits_again_and_is_rendered(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    """What the render worker finds at its start: a chunk marked rendering on the job's slice, its worker
    gone. It is put back without losing an attempt; the slice its dead worker held is released (nobody is
    charged for the time no worker ran it) and the job renders on a slice taken afresh."""
    job = make_job(alice, scenes / "small.blend", [1, 2], State.RENDERING, chunk_size=2)
    held = allocate(alice, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n, state="rendering") for n in (1, 2)])
    chunk = RenderChunk.objects.create(
        job=job, index=0, frames=[1, 2], state="rendering", attempts=1, slice=held, started_at=timezone.now()
    )

    counts = recovery.recover_after_restart()

    assert counts["chunks_put_back"] == 1 and counts["workers_sent"] == 1 and counts["slices_released"] == 1
    assert Slice.objects.get(pk=held.pk).released_at is not None
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 180, "the job to end")
    chunk.refresh_from_db()
    assert state_of(job) == State.DONE and (chunk.state, chunk.attempts) == ("done", 1) and chunk.slice_id != held.pk
    wait_for(lambda: all(taken.released_at for taken in slices_of(job)), 30, "its slices released")


def test_reconciliation_puts_back_a_chunk_whose_worker_died_long_ago_and_it_is_rendered(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    """A chunk marked rendering for minutes with no container left: its worker died with the machine's
    worker (no restart yet). Reconciliation puts it back, counting the attempt, and the slice gets a worker."""
    job = make_job(alice, scenes / "small.blend", [1], State.RENDERING, chunk_size=1)
    held = allocate(alice, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))
    RenderFrame.objects.create(job=job, number=1, state="rendering")
    began = timezone.now() - timedelta(minutes=5)
    chunk = RenderChunk.objects.create(
        job=job, index=0, frames=[1], state="rendering", attempts=1, slice=held, started_at=began
    )

    counts = recovery.reconcile()

    assert counts["chunks_put_back"] == 1
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 180, "the job to end")
    chunk.refresh_from_db()
    assert state_of(job) == State.DONE and (chunk.state, chunk.attempts) == ("done", 2)
    wait_for(lambda: slices_of(job)[0].released_at, 30, "its slice released")
    assert recovery.reconcile()["chunks_put_back"] == 0


def test_a_render_worker_killed_mid_chunk_puts_the_chunk_back_at_its_next_start_and_renders_it(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job = make_job(alice, scenes / "slow.blend", [1], State.AWAITING_CONFIRMATION, chunk_size=1, samples=64)
    services.confirm(job.pk, alice)
    wait_for(lambda: rendering_on_a_held_slice(job) and containers_of(job), 120, "the chunk's container running")
    [first_container] = containers_of(job)

    kill_and_restart_render_worker(render_stack)

    wait_for(lambda: state_of(job) in RenderJob.ENDED, 240, "the job to end after the restart")
    [chunk] = RenderChunk.objects.filter(job=job)
    assert state_of(job) == State.DONE and (chunk.state, chunk.attempts) == ("done", 1), "no attempt lost"
    assert first_container not in containers_of(job)
    wait_for(lambda: all(taken.released_at for taken in slices_of(job)), 30, "its slices released")
    # The slice the killed worker held ended at its last proof of life; the job rendered on one taken afresh.
    cut, rendered = sorted(slices_of(job), key=lambda taken: taken.pk)
    assert cut.held_from is not None and cut.held_until is not None and cut.seen_at is not None
    assert cut.held_until == max(cut.seen_at, cut.held_from) and rendered.held_until is not None


def test_reconciliation_sends_a_worker_to_a_slice_whose_workers_task_was_lost(
    render_stack: Path, render_worker: str, scenes: Path, alice: User
) -> None:
    """The job got its slice, then the broker did not take the slice's worker task: the slice sits held with
    its chunks waiting. Reconciliation sends it a worker and the job renders; a slice just allocated, which
    its own worker is about to reach, is left alone."""
    job = make_job(alice, scenes / "small.blend", [1, 2], State.QUEUED, samples=1)
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=number) for number in (1, 2)])
    RenderChunk.objects.create(job=job, index=0, frames=[1, 2])
    lost = allocate(alice, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))

    assert recovery.reconcile()["workers_sent"] == 0, "a slice allocated just now waits for its own worker"
    Slice.objects.filter(pk=lost.pk).update(allocated_at=timezone.now() - timedelta(minutes=3))
    assert recovery.reconcile()["workers_sent"] == 1

    wait_for(lambda: state_of(job) == State.DONE, 240, "the job rendered on its slice")
    assert RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE).count() == 2
    # The worker lets the slice go once it finds no chunk left, a moment after the job is done.
    wait_for(lambda: Slice.objects.get(pk=lost.pk).released_at is not None, 60, "the slice released")
    assert Slice.objects.get(pk=lost.pk).held_from is not None
    assert [taken.pk for taken in slices_of(job)] == [lost.pk], "no other slice was taken for it"
