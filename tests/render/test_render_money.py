"""A render job's slices and money (issue 30, money 2 and 4): two dispatches at once never give a job more than
``max_slices``; a slice whose worker died is released at its last proof of life, never charged while nobody
worked on it. The steps are the database's alone (which slices a job holds, when a holding ends), so these
run without Docker; the real stack's worker death is in test_lifecycle_failures."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from billing import meter
from billing.models import ChargedMinute
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.render import chunks, queues, recovery, services, slices
from sessions.render.models import RenderChunk, RenderJob
from tests.factories import one_frame_a_chunk
from tests.gpus.conftest import use_fleet
from tests.render.conftest import waiting_on

WHOLE = {"gpu_kind": "whole", "gpu_profile": "", "gpu_model": "A100-SXM4-80GB"}


@pytest.fixture
def fleet(settings, render_dir: Path) -> Iterator[None]:  # type: ignore[no-untyped-def]
    use_fleet(settings, "r: 6xA100-80GB:whole")
    settings.MAX_SLICES_PER_USER = 20
    yield
    get_backend.cache_clear()


def queued_job(owner: User, chunks: int, max_slices: int) -> RenderJob:
    return one_frame_a_chunk(owner, RenderJob.State.QUEUED, chunks, max_slices)


@pytest.mark.django_db(transaction=True)
def test_two_dispatches_at_once_never_give_a_job_more_than_its_max_slices(
    fleet: None, quiet_render_queue: str, alice: User
) -> None:
    """The confirm's task and reconciliation's every 30 s overlap: each read the slices held before the other
    allocated, and the job ended up holding twice what it may."""
    job = queued_job(alice, chunks=6, max_slices=2)
    start = threading.Barrier(4)

    def run() -> None:
        try:
            start.wait(30)
            slices.dispatch(job.pk)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(services.held_by(job.pk)) == 2


@pytest.mark.django_db
def test_a_slice_whose_worker_died_between_chunks_is_released_at_its_last_proof_of_life(
    fleet: None, quiet_render_queue: str, alice: User
) -> None:
    """Nobody worked on it for minutes (its worker died after a chunk): charging it until a new worker came
    along would bill the time nobody used it. It is released, its holding ended at its last proof of life, and
    the job gets a slice afresh."""
    job = queued_job(alice, chunks=2, max_slices=1)
    RenderJob.objects.filter(pk=job.pk).update(state=RenderJob.State.RENDERING)
    held = allocate(alice, job.request, holder=Holder.render(job.pk))
    long_ago = timezone.now() - timedelta(minutes=30)
    Slice.objects.filter(pk=held.pk).update(allocated_at=long_ago)
    began = database_now() - timedelta(minutes=30)
    holdings.started(held.pk, began)
    holdings.seen([held.pk], at=began + timedelta(minutes=3, seconds=20))  # its worker's last line
    RenderChunk.objects.filter(job=job, index=0).update(
        state=RenderChunk.State.DONE, slice=held, finished_at=long_ago + timedelta(minutes=3)
    )
    counts = recovery.reconcile()
    held.refresh_from_db()
    assert held.released_at is not None and held.held_until == began + timedelta(minutes=3, seconds=20)
    assert counts["workers_sent"] == 1 and [s.pk for s in services.held_by(job.pk)] != [held.pk]
    meter.tick()
    assert ChargedMinute.objects.filter(usage__slice=held).count() == 4


@pytest.mark.django_db
def test_at_the_render_worker_s_start_every_slice_its_dead_workers_held_ends_at_its_last_proof_of_life(
    fleet: None, quiet_render_queue: str, alice: User
) -> None:
    job = queued_job(alice, chunks=3, max_slices=1)
    RenderJob.objects.filter(pk=job.pk).update(state=RenderJob.State.RENDERING)
    held = allocate(alice, job.request, holder=Holder.render(job.pk))
    began = database_now() - timedelta(minutes=20)
    holdings.started(held.pk, began)
    holdings.seen([held.pk], at=began + timedelta(minutes=1, seconds=5))
    RenderChunk.objects.filter(job=job, index=0).update(state=RenderChunk.State.RENDERING, slice=held, attempts=1)
    counts = recovery.recover_after_restart()
    held.refresh_from_db()
    assert counts["chunks_put_back"] == 1 and counts["slices_released"] == 1
    assert held.held_until == began + timedelta(minutes=1, seconds=5) and held.released_at is not None
    chunk = RenderChunk.objects.get(job=job, index=0)
    assert (chunk.state, chunk.attempts) == (RenderChunk.State.PENDING, 0)
    assert len(services.held_by(job.pk)) == 1  # a fresh slice, for a fresh worker


@pytest.mark.django_db
def test_a_newcomer_gets_an_equal_share_of_the_render_threads_and_no_more(
    fleet: None, quiet_render_queue: str, alice: User, bob: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """Two render threads: alone, a person's job takes both; with a second person rendering, each gets one."""
    settings.RENDER_THREADS = 2
    first = queued_job(alice, chunks=6, max_slices=4)
    assert slices.dispatch(first.pk) == 2  # all the threads there are, not its four slices
    second = queued_job(bob, chunks=3, max_slices=4)
    assert slices.dispatch(second.pk) == 1
    assert (len(services.held_by(first.pk)), len(services.held_by(second.pk))) == (2, 1)


@pytest.mark.django_db
def test_a_long_job_yields_a_render_thread_to_another_person_s_job_between_its_chunks(
    fleet: None, quiet_render_queue: str, alice: User, bob: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """The issue's sequence: one person's job held both render threads and everyone else's work sat waiting for
    minutes. At its next chunk one of its slices' workers lets its slice and thread go, and the other person's
    job is given them; the long job goes on on its other slice."""
    settings.RENDER_THREADS = 2
    long = queued_job(alice, chunks=6, max_slices=2)
    slices.dispatch(long.pk)
    first, second = services.held_by(long.pk)
    waiting = queued_job(bob, chunks=2, max_slices=2)
    assert chunks._claim(waiting.pk, first.pk) is None  # not its slice
    assert chunks._claim(long.pk, first.pk) == chunks.YIELD
    assert chunks.work_on_slice(long.pk, first.pk) == 0
    first.refresh_from_db()
    assert first.released_at is not None and [s.pk for s in services.held_by(long.pk)] == [second.pk]
    assert len(services.held_by(waiting.pk)) == 1  # given the thread that was let go
    claimed = chunks._claim(long.pk, second.pk)
    assert isinstance(claimed, chunks.Claim)  # its share: one slice, which renders on


@pytest.mark.django_db
def test_each_slice_s_worker_goes_to_the_render_queue_of_the_slice_s_host(
    quiet_render_queue: str, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """Issue 31: a slice's chunks render on the machine that holds it, so its worker goes to that host's own
    render queue (``<render queue>@<host>``), which only that machine's render worker reads."""
    use_fleet(settings, "r: 1xA100-80GB:whole; s: 1xA100-80GB:whole")
    job = queued_job(alice, chunks=2, max_slices=2)
    assert slices.dispatch(job.pk) == 2
    on = {taken.gpu.host.name: taken.pk for taken in services.held_by(job.pk)}
    assert sorted(on) == ["r", "s"]
    assert waiting_on(quiet_render_queue) == []  # nothing on the queue every host's worker reads
    assert waiting_on(f"{quiet_render_queue}@r") == [[job.pk, on["r"]]]
    assert waiting_on(f"{quiet_render_queue}@s") == [[job.pk, on["s"]]]
    assert {"r", "s"} <= set(queues.hosts_here())  # simulated GPUs: this machine stands in for every host


@pytest.mark.django_db
def test_a_render_worker_s_restart_puts_back_only_its_own_host_s_chunks(
    quiet_render_queue: str, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """The render worker of host r restarts: r's chunk was cut off and its slice is released; the chunk that
    renders on s, under s's own worker, goes on."""
    use_fleet(settings, "r: 1xA100-80GB:whole; s: 1xA100-80GB:whole")
    job = queued_job(alice, chunks=3, max_slices=2)
    RenderJob.objects.filter(pk=job.pk).update(state=RenderJob.State.RENDERING)
    held = {}
    for index in (0, 1):
        taken = allocate(alice, job.request, holder=Holder.render(job.pk))
        held[taken.gpu.host.name] = taken
        RenderChunk.objects.filter(job=job, index=index).update(
            state=RenderChunk.State.RENDERING, slice=taken, attempts=1
        )
    counts = recovery.recover_after_restart("r")
    assert (counts["chunks_put_back"], counts["slices_released"]) == (1, 1)
    assert Slice.objects.get(pk=held["r"].pk).released_at is not None
    assert Slice.objects.get(pk=held["s"].pk).released_at is None
    assert RenderChunk.objects.get(job=job, slice=held["s"]).state == RenderChunk.State.RENDERING
    assert RenderChunk.objects.filter(job=job, state=RenderChunk.State.PENDING).count() == 2
