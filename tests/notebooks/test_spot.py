"""Spot sessions give way to on-demand launches: the notice, the grace time, the stop and the hand-over.

The services as they run, without a hub: the spawner's reports are given to record_event as the
internal API would (test_spot_flow.py runs the same through the real hub, spawner and Docker).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from portal.roles import USERS
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Gpu, Reclaim, Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import (
    SPOT_DID_NOT_FIT,
    ContainerEnd,
    Launch,
    LaunchRefused,
    preempt_due_spot,
    preempt_spot,
    record_event,
    start_session,
    stop_session,
)
from tests.factories import make_user

pytestmark = pytest.mark.django_db
State, Reason = NotebookSession.State, NotebookSession.EndReason
WHOLE_H200 = SliceRequest("mig", "7g.141gb")
SMALL = SliceRequest("mig", "1g.18gb")


def running(owner: User, image: NotebookImage, request: SliceRequest, spot: bool, name: str = "lab") -> NotebookSession:
    session = start_session(owner, Launch(request, image.pk, name, spot=spot))
    record_event(session.pk, "container_started", container_id="c", at=timezone.now() - timedelta(minutes=3))
    return record_event(session.pk, "ready")


def slice_of(session: NotebookSession) -> Slice:
    assert session.slice_id is not None
    return Slice.objects.get(pk=session.slice_id)


def reclaim_of(session: NotebookSession) -> Reclaim:
    return Reclaim.objects.get(waiting_id=session.pk)


def gone(session: NotebookSession) -> NotebookSession:
    """The spawner reports the container gone (the hub was asked to stop it)."""
    return record_event(session.pk, "stopped", end=ContainerEnd(at=timezone.now(), exit_code=0))


def test_an_on_demand_launch_on_a_full_gpu_waits_for_a_spot_slice_and_its_owner_is_told(
    notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    assert slice_of(spot).market == Slice.Market.SPOT
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    assert waiting.state == State.ALLOCATING and waiting.slice_id is None
    assert waiting.progress_message.startswith("Waiting for a spot session to hand over its slice, at ")
    reclaim = reclaim_of(waiting)
    assert (reclaim.slice_id, reclaim.state, reclaim.owner) == (spot.slice_id, Reclaim.State.PENDING, alice)
    assert reclaim.due_at - reclaim.noticed_at == timedelta(seconds=120)  # PORTAL_SPOT_GRACE_SECONDS' default
    spot.refresh_from_db()
    assert spot.state == State.RUNNING and spot.warned_at == reclaim.noticed_at
    assert "reclaimed for an on-demand session" in spot.warning and f"{reclaim.due_at:%H:%M:%S}" in spot.warning


def test_after_the_grace_time_the_spot_session_is_preempted_and_the_waiting_one_gets_the_slice(
    notebook_image: NotebookImage, alice: User, bob: User, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.SPOT_GRACE_SECONDS = 0
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    reclaim = reclaim_of(waiting)
    assert preempt_spot(reclaim.pk) is not None
    spot.refresh_from_db()
    assert (spot.state, spot.ended_reason) == (State.STOPPING, Reason.PREEMPTED)
    assert slice_of(spot).active  # still its own until its container is gone
    ended = gone(spot)
    assert (ended.state, ended.ended_reason) == (State.PREEMPTED, Reason.PREEMPTED)
    held = slice_of(spot)
    assert not held.active and held.held_until == ended.container_gone_at  # billed up to its end
    waiting.refresh_from_db()
    assert waiting.state == State.STARTING and waiting.slice is not None
    assert waiting.slice.gpu_id == held.gpu_id and waiting.slice.market == Slice.Market.ON_DEMAND
    assert reclaim_of(waiting).state == Reclaim.State.HANDED_OVER


def test_nothing_is_stopped_before_the_grace_time_is_up(notebook_image: NotebookImage, alice: User, bob: User) -> None:
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    assert preempt_spot(reclaim_of(waiting).pk) is None
    assert preempt_due_spot() == 0
    spot.refresh_from_db()
    assert spot.state == State.RUNNING


def test_the_sweep_preempts_what_is_due_once(notebook_image: NotebookImage, alice: User, bob: User) -> None:
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    Reclaim.objects.filter(pk=reclaim_of(waiting).pk).update(due_at=timezone.now() - timedelta(seconds=1))
    assert preempt_due_spot() == 1
    assert preempt_due_spot() == 0  # already stopping: not asked again
    spot.refresh_from_db()
    assert (spot.state, spot.ended_reason) == (State.STOPPING, Reason.PREEMPTED)


def test_a_waiting_launch_stopped_by_its_owner_cancels_the_reclaim_and_the_spot_session_runs_on(
    notebook_image: NotebookImage,
    alice: User,
    bob: User,
    settings,  # type: ignore[no-untyped-def]
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.SPOT_GRACE_SECONDS = 0
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    with django_capture_on_commit_callbacks(execute=True):
        stopped = stop_session(waiting.pk, by=alice)
    assert (stopped.state, stopped.ended_reason) == (State.STOPPED, Reason.USER)
    assert reclaim_of(waiting).state == Reclaim.State.CANCELLED
    assert preempt_spot(reclaim_of(waiting).pk) is None
    spot.refresh_from_db()
    assert spot.state == State.RUNNING and spot.warning == "" and spot.warned_at is None
    # Its owner may launch again at once; the spot slice can be promised again.
    again = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    assert again.state == State.ALLOCATING and reclaim_of(again).slice_id == spot.slice_id


def test_a_waiting_launch_gone_before_the_spot_stop_leaves_the_room_to_everyone(
    notebook_image: NotebookImage,
    alice: User,
    bob: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.SPOT_GRACE_SECONDS = 0
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    preempt_spot(reclaim_of(waiting).pk)
    stop_session(waiting.pk, by=alice)  # gives up while the spot container is being stopped
    ended = gone(spot)
    assert ended.state == State.PREEMPTED
    assert not Slice.objects.filter(released_at__isnull=True).exists()
    waiting.refresh_from_db()
    assert waiting.state == State.STOPPED and waiting.slice_id is None


def test_two_on_demand_launches_never_claim_the_same_spot_slice(
    notebook_image: NotebookImage, alice: User, bob: User, staff: User
) -> None:
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    first = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    with pytest.raises(LaunchRefused) as refused:
        start_session(staff, Launch(SMALL, notebook_image.pk, "urgent"))
    assert refused.value.code == "no_capacity"
    assert list(Reclaim.objects.values_list("slice_id", "waiting_id")) == [(spot.slice_id, first.pk)]


def test_an_on_demand_session_is_never_reclaimed(notebook_image: NotebookImage, alice: User, bob: User) -> None:
    held = running(bob, notebook_image, WHOLE_H200, spot=False)
    with pytest.raises(LaunchRefused, match="No 1g.18gb slice is free now") as refused:
        start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    assert refused.value.code == "no_capacity"
    held.refresh_from_db()
    assert held.state == State.RUNNING and held.warning == ""
    assert not Reclaim.objects.exists() and not NotebookSession.objects.filter(owner=alice).exists()


def test_a_spot_launch_does_not_reclaim_another_spot_session(
    notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    running(bob, notebook_image, WHOLE_H200, spot=True)
    with pytest.raises(LaunchRefused) as refused:
        start_session(alice, Launch(SMALL, notebook_image.pk, "cheap", spot=True))
    assert refused.value.code == "no_capacity" and not Reclaim.objects.exists()


def test_a_spot_session_its_owner_stops_during_the_grace_time_still_hands_over(
    notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    stop_session(spot.pk, by=bob)
    ended = gone(spot)
    assert (ended.state, ended.ended_reason) == (State.STOPPED, Reason.USER)  # not preempted: it chose to stop
    waiting.refresh_from_db()
    assert waiting.state == State.STARTING and waiting.slice is not None


def test_a_waiting_session_that_no_longer_fits_fails_with_a_clear_message(
    notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    spot = running(bob, notebook_image, WHOLE_H200, spot=True)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    Gpu.objects.filter(slices=spot.slice_id).update(state=Gpu.State.ERROR)  # the GPU broke meanwhile
    stop_session(spot.pk, by=None, reason=Reason.PREEMPTED)
    gone(spot)
    waiting.refresh_from_db()
    assert waiting.state == State.FAILED and waiting.failure_message == SPOT_DID_NOT_FIT
    assert "No " in waiting.failure_detail
    assert reclaim_of(waiting).state == Reclaim.State.CANCELLED
    assert not Slice.objects.filter(released_at__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
def test_two_launches_at_once_get_one_promise(notebook_image: NotebookImage, alice: User, bob: User) -> None:
    """Two on-demand launches in two connections at the same moment: one waits for the spot slice, one is refused."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one writing transaction at a time")
    running(bob, notebook_image, WHOLE_H200, spot=True)
    people = [alice, make_user("erin", [USERS])]
    outcomes: list[str] = []
    start = threading.Barrier(len(people))

    def launch(person: User) -> None:
        start.wait()
        try:
            outcomes.append(start_session(person, Launch(SMALL, notebook_image.pk, "urgent")).state)
        except LaunchRefused as refused:
            outcomes.append(refused.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=launch, args=(person,)) for person in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == sorted([State.ALLOCATING, "no_capacity"])
    assert Reclaim.objects.filter(state=Reclaim.State.PENDING).count() == 1


def test_the_cards_show_the_notice_and_the_wait(notebook_image: NotebookImage, alice: User, bob: User) -> None:
    from django.test import Client

    running(bob, notebook_image, WHOLE_H200, spot=True)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    owner, them = Client(), Client()
    owner.force_login(bob)
    them.force_login(alice)
    bobs = owner.get("/sessions/", headers={"HX-Request": "true", "HX-Target": "session-cards"}).content.decode()
    assert 'data-testid="session-notice"' in bobs and "is reclaimed for an on-demand session" in bobs
    assert "is reclaimed" in owner.get("/").content.decode()  # the dashboard says it too
    alices = them.get("/sessions/", headers={"HX-Request": "true", "HX-Target": "session-cards"}).content.decode()
    assert f'<progress id="progress-{waiting.pk}" max="100"' in alices
    assert "Waiting for a spot session to hand over its slice" in alices
    assert "every 3s" in alices  # the cards poll while it waits
    assert "session-notice" not in alices


def test_a_spot_render_job_gives_its_slice_to_a_waiting_launch_and_renders_on(
    notebook_image: NotebookImage,
    alice: User,
    bob: User,
    settings,  # type: ignore[no-untyped-def]
    quiet_render_queue: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Spot reclaim through the workload registry: a render job's spot slice is taken back like a session's. Its
    chunk there waits again without losing an attempt, the slice is released at its container's end and handed
    to the on-demand launch waiting for it in the same turn, and the job goes on."""
    from sessions.gpus import holdings
    from sessions.gpus.allocator import allocate
    from sessions.gpus.holders import Holder
    from sessions.render.models import RenderChunk, RenderJob
    from tests.factories import one_frame_a_chunk

    settings.SPOT_GRACE_SECONDS = 0
    job = one_frame_a_chunk(bob, RenderJob.State.RENDERING, frames=3, max_slices=1)
    taken = allocate(bob, SliceRequest("mig", "7g.141gb", market=Slice.Market.SPOT), holder=Holder.render(job.pk))
    holdings.started(taken.pk, timezone.now() - timedelta(minutes=2))
    RenderChunk.objects.filter(job=job, index=0).update(state="rendering", slice=taken, attempts=1)
    waiting = start_session(alice, Launch(SMALL, notebook_image.pk, "urgent"))
    assert waiting.state == State.ALLOCATING and reclaim_of(waiting).slice_id == taken.pk
    with django_capture_on_commit_callbacks(execute=True):
        assert preempt_spot(reclaim_of(waiting).pk) == Holder.render(job.pk)
    taken.refresh_from_db()
    assert taken.released_at is not None and taken.held_until is not None  # charged to its end
    chunk = RenderChunk.objects.get(job=job, index=0)
    assert (chunk.state, chunk.attempts) == ("pending", 0)
    assert RenderJob.objects.get(pk=job.pk).state == RenderJob.State.RENDERING  # it goes on
    waiting.refresh_from_db()
    assert waiting.state == State.STARTING and waiting.slice is not None and waiting.slice.gpu_id == taken.gpu_id
    assert reclaim_of(waiting).state == Reclaim.State.HANDED_OVER
