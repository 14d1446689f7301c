"""What reconciliation means for money (issue 30, money 2 and 3): a container seen running is the only proof
its session's holding still runs, so nothing is charged while the engine cannot be reached; a start whose
report never reached the portal is recorded from the engine's own StartedAt, so no session runs for free."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from billing import meter
from billing.models import ChargedMinute, Usage
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.reconcile import reconcile
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.spec import INSTANCE_LABEL
from tests.factories import running_session

pytestmark = pytest.mark.django_db
L4 = SliceRequest(kind="whole", model="L4")


@pytest.fixture
def session(notebook_image: NotebookImage, alice: User) -> NotebookSession:
    from billing import seeds
    from billing.models import Price

    seeds.ensure(Price)
    return running_session(alice, notebook_image, L4, "lab")


@pytest.fixture
def container(docker_engine: str, user_network: object, session: NotebookSession) -> Iterator[str]:
    """The session's container as the spawner would have started it (its labels), running."""
    runtime = DockerRuntime()
    labels = {"gpu-portal.session": str(session.pk), INSTANCE_LABEL: settings.INSTANCE_ID}
    found = runtime.client.containers.run("gpu-portal/busybox:latest", ["sleep", "120"], labels=labels, detach=True)
    yield str(found.id)
    runtime.remove(str(found.id))


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)  # the engine's moments are real ones: the database's now must move too
def test_a_session_whose_start_report_never_came_is_charged_from_its_container_s_start(
    session: NotebookSession, container: str
) -> None:
    NotebookSession.objects.filter(pk=session.pk).update(container_started_at=None)
    runtime = DockerRuntime()
    started = runtime.client.containers.get(container).attrs["State"]["StartedAt"]
    assert reconcile(runtime)["confirmed"] == 1
    session.refresh_from_db()
    assert session.container_started_at is not None and session.container_started_at.isoformat()[:19] == started[:19]
    assert session.slice_id is not None
    held = Slice.objects.get(pk=session.slice_id)
    assert held.held_from == session.container_started_at and held.seen_at is not None
    assert meter.tick().minutes == 1 and Usage.objects.get(slice=held).billed_minutes == 1


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_a_container_seen_running_is_the_proof_of_life_its_holding_is_charged_by(
    session: NotebookSession, container: str
) -> None:
    assert session.slice_id is not None and session.container_started_at is not None
    began = database_now() - timedelta(minutes=4, seconds=30)
    NotebookSession.objects.filter(pk=session.pk).update(container_started_at=began)
    holdings.started(session.slice_id, began)
    assert meter.tick().minutes == 1  # nothing has seen it run since its start
    before = database_now()
    reconcile(DockerRuntime())
    seen_at = Slice.objects.get(pk=session.slice_id).seen_at
    assert seen_at is not None and before <= seen_at <= database_now()
    assert meter.tick().minutes == 4  # minutes 1 to 4 began before the look that saw it running


def test_while_the_engine_cannot_be_reached_nothing_is_confirmed_and_nothing_more_is_charged(
    session: NotebookSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert session.slice_id is not None
    began = database_now() - timedelta(minutes=10, seconds=30)
    holdings.started(session.slice_id, began)
    holdings.seen([session.slice_id], at=began + timedelta(minutes=2, seconds=10))  # the last look that saw it
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # the engine is gone
    counts = reconcile()
    assert counts["engine_unreachable"] == 1 and counts["ended"] == 0
    assert meter.tick().minutes == 3
    assert list(ChargedMinute.objects.values_list("minute", flat=True).order_by("minute")) == [0, 1, 2]
    assert NotebookSession.objects.get(pk=session.pk).state == NotebookSession.State.RUNNING
