"""Reconciliation keeps going when one thing in it cannot be repaired (the Docker parts are in test_launch)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from sessions.gpus import agency
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, HostOrder, Slice
from sessions.notebooks.reconcile import _release_orphan_slices
from tests.gpus.conftest import use_fleet

pytestmark = pytest.mark.django_db


def test_orphan_slices_are_released_at_once_whatever_their_hosts_agent_is_doing(settings, alice: User) -> None:  # type: ignore[no-untyped-def]
    """Releasing never waits on a host's driver: an orphan on a host whose agent is away is released at once (its
    room free, its charges over) and its instance's end waits as an order for that host's agent."""
    use_fleet(settings, "here: 1xH200:mig; there: 1xH200:mig")
    settings.MAX_SLICES_PER_USER = 10
    here = allocate(alice, SliceRequest("mig", "1g.18gb", host="here"), holder=Holder.notebook(999001))
    there = allocate(alice, SliceRequest("mig", "1g.18gb", host="there"), holder=Holder.notebook(999002))
    agency.stop_acting_for([agency.EVERY_HOST])  # from here on this process is the agent of "here" alone
    try:
        with agency.acting_for(["here"]):
            assert _release_orphan_slices() == 2
    finally:
        agency.act_for([agency.EVERY_HOST])
    assert not Slice.objects.get(pk=here.pk).active and not Slice.objects.get(pk=there.pk).active
    destroys = HostOrder.objects.filter(action=HostOrder.Action.DESTROY).order_by("host__name")
    assert [(order.host.name, order.state) for order in destroys] == [("here", "done"), ("there", "pending")]
    assert Gpu.objects.get(host__name="there").compute_used == 0  # the room is the allocator's again


@pytest.mark.docker
def test_reconciliation_leaves_another_portals_containers_alone(docker_engine: str, settings) -> None:  # type: ignore[no-untyped-def]
    """Two portals (or test runs) on one engine: each removes only the strays it labelled itself."""
    from sessions.notebooks.reconcile import reconcile
    from sessions.runtime.docker import DockerRuntime
    from sessions.runtime.spec import INSTANCE_LABEL

    runtime = DockerRuntime()
    labels = {"gpu-portal.session": "999003"}  # a session number this database does not have
    theirs = runtime.client.containers.run(
        "gpu-portal/busybox:latest", ["sleep", "60"], labels={**labels, INSTANCE_LABEL: "another-portal"}, detach=True
    )
    mine = runtime.client.containers.run(
        "gpu-portal/busybox:latest",
        ["sleep", "60"],
        labels={**labels, INSTANCE_LABEL: settings.INSTANCE_ID},
        detach=True,
    )
    try:
        assert reconcile(runtime)["containers_removed"] == 1
        assert runtime.client.containers.list(all=True, filters={"id": theirs.id})
        assert not runtime.client.containers.list(all=True, filters={"id": mine.id})
    finally:
        theirs.remove(force=True)
        runtime.remove(mine.id)


@pytest.mark.docker
def test_a_start_with_no_container_fails_only_once_its_slice_has_waited_the_hubs_patience(
    docker_engine: str,
    settings,
    alice: User,
    notebook_image,  # type: ignore[no-untyped-def]
) -> None:
    """The clock starts when the session got its slice: one handed a reclaimed spot slice waited the grace
    time first, and must not be failed for it."""
    from datetime import timedelta

    from django.utils import timezone

    from sessions.notebooks.models import NotebookSession
    from sessions.notebooks.reconcile import NEVER_STARTED, _check
    from sessions.notebooks.services import Launch, start_session
    from sessions.runtime.docker import DockerRuntime

    # Nothing asks the hub (the start is enqueued after a commit this test's transaction never makes).
    past = timezone.now() - timedelta(seconds=settings.HUB_START_PATIENCE_SECONDS + 600)
    handed = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "handed"))
    NotebookSession.objects.filter(pk=handed.pk).update(requested_at=past)
    assert _check(NotebookSession.objects.get(pk=handed.pk), DockerRuntime()) == "ok"
    assert handed.slice is not None
    Slice.objects.filter(pk=handed.slice.pk).update(allocated_at=past)
    assert _check(NotebookSession.objects.get(pk=handed.pk), DockerRuntime()) == "failed"
    handed.refresh_from_db()
    assert handed.state == NotebookSession.State.FAILED and handed.failure_message == NEVER_STARTED


def test_a_start_counts_as_lost_when_it_never_reached_the_broker_for_a_while_or_went_silent_for_long(
    settings,
    alice: User,
    notebook_image,  # type: ignore[no-untyped-def]
) -> None:
    """Never sent: a short grace after the session got its slice (its send may be under way). Sent: it is
    heard of while it runs and each time it asks the hub again; silence is what tells it was lost."""
    from datetime import timedelta

    from sessions.notebooks.reconcile import START_SEND_GRACE, START_SILENCE, _start_lost
    from sessions.notebooks.services import Launch, start_session

    # Nothing is sent: the start goes after a commit this test's transaction never makes.
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "unsent"))
    assert session.start_sent_at is None and session.slice is not None
    got_slice, second = session.slice.allocated_at, timedelta(seconds=1)
    assert not _start_lost(session, got_slice + START_SEND_GRACE - second)
    assert _start_lost(session, got_slice + START_SEND_GRACE + second)
    session.start_sent_at = got_slice + START_SEND_GRACE
    assert not _start_lost(session, session.start_sent_at + START_SILENCE - second)
    assert _start_lost(session, session.start_sent_at + START_SILENCE + second)
