"""Reconciliation per engine (issue 31): each GPU host's containers run on its own Docker engine
(``PORTAL_DOCKER_ENGINES``, ``sessions.runtime.engines``); one engine that does not answer confirms nothing of
its hosts' sessions, and stops nothing on the others."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.reconcile import reconcile
from sessions.runtime import engines
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.spec import INSTANCE_LABEL
from tests.factories import running_session
from tests.gpus.conftest import use_fleet
from tests.helpers.processes import GONE_ENGINE

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def two_hosts(settings) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, "near: 1xL4:whole, 1xL4:whole; far: 1xL4:whole")
    settings.DOCKER_ENGINES = {"far": GONE_ENGINE}
    settings.MAX_SLICES_PER_USER = 10


def on(host: str, owner: User, image: NotebookImage, name: str) -> NotebookSession:
    session = running_session(owner, image, SliceRequest("whole", model="L4", host=host), name)
    assert session.slice_id is not None
    began = database_now() - timedelta(minutes=5)
    holdings.started(session.slice_id, began)
    holdings.seen([session.slice_id], at=began + timedelta(minutes=1))
    return session


@pytest.fixture
def running_near(
    docker_engine: str, user_network: object, two_hosts: None, alice: User, notebook_image: NotebookImage
) -> Iterator[NotebookSession]:
    """A session on "near" whose container runs on the local engine, as the spawner would have started it."""
    session = on("near", alice, notebook_image, "near-run")
    labels = {"gpu-portal.session": str(session.pk), INSTANCE_LABEL: settings.INSTANCE_ID}
    runtime = DockerRuntime()
    found = runtime.client.containers.run("gpu-portal/busybox:latest", ["sleep", "120"], labels=labels, detach=True)
    yield session
    runtime.remove(str(found.id))


def test_hosts_are_grouped_by_the_engine_that_runs_their_containers(two_hosts: None) -> None:
    assert engines.by_engine(["near", "far", "near"]) == {engines.LOCAL: ["near"], GONE_ENGINE: ["far"]}
    assert engines.by_engine([]) == {engines.LOCAL: []}  # this machine's engine is always followed


def test_an_engine_that_does_not_answer_stops_nothing_on_the_others(
    running_near: NotebookSession, alice: User, notebook_image: NotebookImage
) -> None:
    gone_near = on("near", alice, notebook_image, "near-gone")  # its container is gone: it ends
    far = on("far", alice, notebook_image, "far-run")  # its engine is away: left as it is, charged no further
    near_slice, far_slice = running_near.slice_id or 0, far.slice_id or 0
    far_seen = Slice.objects.get(pk=far_slice).seen_at
    before = database_now()
    counts = reconcile()
    assert counts["engine_unreachable"] == 1
    assert (counts["confirmed"], counts["ended"]) == (1, 1)
    seen = Slice.objects.get(pk=near_slice).seen_at
    assert seen is not None and seen >= before  # near's engine saw its container: the proof moved
    assert NotebookSession.objects.get(pk=gone_near.pk).state in NotebookSession.ENDED
    assert NotebookSession.objects.get(pk=far.pk).state == NotebookSession.State.RUNNING
    assert Slice.objects.get(pk=far_slice).seen_at == far_seen  # nothing confirmed there
    assert Slice.objects.get(pk=far_slice).released_at is None
