# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""Cancel is final, at every step of a chunk's start, on the real stack (PostgreSQL, Docker, the render image,
Blender): the slice's worker runs here, in a thread, and the job is cancelled as its worker stands at one
step: its claim of the chunk waiting to commit (held by a row lock of the test's), its container asked for
but not yet created, created but not yet started, just started (each held at the Docker engine's socket by
``tests/helpers/docker_gate.py``). Whichever step, no container of the job is left, no frame is rendered
after the cancel, every slice of the job is released, and none holds a holding left open."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction

from sessions.gpus.models import Slice
from sessions.render import chunks, filestore, stopping
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.helpers.docker_gate import Hold, docker_gate
from tests.render.sandbox_acts import alongside
from tests.render.stack import (  # noqa: F401 (fixtures)
    containers_of,
    queued_as_one_chunk,
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
CREATE = r"/containers/create$"
START = r"/containers/[0-9a-f]+/start$"


def assert_cancel_was_final(job: RenderJob, held: Slice) -> None:
    assert state_of(job) == State.CANCELLED
    assert containers_of(job) == [], "a container of the job is left"
    assert not RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE).exists(), "a frame was rendered"
    rendered = sorted(path.name for path in (job.folder_path() / filestore.FRAMES).rglob("frame_*"))
    assert rendered == [], f"frames written after the cancel: {rendered}"
    assert RenderChunk.objects.get(job=job).state == RenderChunk.State.CANCELLED
    for taken in slices_of(job):
        assert taken.released_at is not None, f"slice {taken.pk} is still held"
        assert taken.held_from is None or taken.held_until is not None, f"slice {taken.pk}'s holding is left open"
    assert [taken.pk for taken in slices_of(job)] == [held.pk]


def cancelled_at(job: RenderJob, held: Slice, hold: Hold) -> None:
    """Run the slice's worker until it reaches ``hold``, cancel the job there, then let the worker go on."""
    with alongside(lambda: chunks.work_on_slice(job.pk, held.pk), before_join=hold.stop):
        hold.wait_arrived()
        stopping.cancel(job.pk)
        hold.release()


def test_a_cancel_between_the_claim_and_the_containers_create_starts_no_container(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job, held = queued_as_one_chunk(alice, scenes / "small.blend", [1, 2], (64, 48))
    with docker_gate() as gate:
        cancelled_at(job, held, gate.hold("POST", CREATE))
    assert_cancel_was_final(job, held)


def test_a_cancel_between_the_containers_create_and_its_start_stops_it_at_its_start(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job, held = queued_as_one_chunk(alice, scenes / "small.blend", [1, 2], (64, 48))
    with docker_gate() as gate:
        cancelled_at(job, held, gate.hold("POST", START))
    assert_cancel_was_final(job, held)


def test_a_cancel_just_after_the_container_started_stops_it_and_leaves_no_holding_open(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job, held = queued_as_one_chunk(alice, scenes / "small.blend", [1, 2], (64, 48))
    with docker_gate() as gate:
        cancelled_at(job, held, gate.hold("POST", START, response=True))
    assert_cancel_was_final(job, held)


def waiting_on_a_lock(fragment: str) -> bool:
    """Whether a session of this test's database waits for a lock in a statement holding ``fragment``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE %s",
            [f"%{fragment}%"],
        )
        return bool(cursor.fetchone()[0])


def test_a_cancel_that_waits_for_the_claim_to_commit_starts_no_container(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    """The claim has locked the job and waits for the chunk's row (a lock of the test's); the cancel waits for
    the job's; the chunk's lock goes, the claim commits, then the cancel does."""
    job, held = queued_as_one_chunk(alice, scenes / "small.blend", [1, 2], (64, 48))
    chunk_locked, let_go = threading.Event(), threading.Event()

    def hold_the_chunk() -> None:
        with transaction.atomic():
            list(RenderChunk.objects.select_for_update(of=("self",)).filter(job=job))  # not the job's row
            chunk_locked.set()
            let_go.wait(120)

    def cancel() -> None:
        stopping.cancel(job.pk)

    with alongside(hold_the_chunk, before_join=let_go.set):
        chunk_locked.wait(30)
        with alongside(lambda: chunks.work_on_slice(job.pk, held.pk), before_join=let_go.set):
            wait_for(lambda: waiting_on_a_lock("render_renderchunk"), 60, "the claim waiting for the chunk")
            with alongside(cancel):
                wait_for(lambda: waiting_on_a_lock("render_renderjob"), 60, "the cancel waiting for the job")
                let_go.set()
    assert_cancel_was_final(job, held)
