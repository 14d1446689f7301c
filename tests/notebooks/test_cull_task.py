"""Culling against the real parts: the hub's own record of activity, and the beat's task in the worker.

test_culling.py judges given moments; here the moments come from JupyterHub about a session that
really runs (portal -> Celery -> hub -> spawner -> Docker), and the cull task runs in the Celery worker.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.culling import hub_activity
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session
from sessions.notebooks.tasks import cull_idle_sessions
from sessions.runtime.docker import DockerRuntime
from tests.helpers.processes import free_port
from tests.helpers.waiting import state_of, wait_for

pytestmark = [pytest.mark.hub, pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = NotebookSession.State


def running(owner: User, image: NotebookImage, name: str) -> NotebookSession:
    session = start_session(owner, Launch(SliceRequest("mig", "1g.18gb"), image.pk, name))
    wait_for(lambda: state_of(session) == State.RUNNING, 120, "the session to run")
    return session


def long_quiet(session: NotebookSession, hours: float) -> None:
    """As far as the portal's own rows say, the session has been up and quiet for ``hours``."""
    then = timezone.now() - timedelta(hours=hours)
    NotebookSession.objects.filter(pk=session.pk).update(requested_at=then, ready_at=then, last_activity=then)


def test_the_hub_reports_when_it_last_saw_a_running_session(
    hub: str, notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    session = running(alice, notebook_image, "watched")
    unknown = NotebookSession.objects.create(owner=bob, server_name="never", image=notebook_image, state=State.RUNNING)
    found = hub_activity(list(NotebookSession.objects.filter(pk__in=[session.pk, unknown.pk]).select_related("owner")))
    seen = found[session.pk]
    assert seen is not None and seen.tzinfo is not None, found
    assert session.requested_at - timedelta(seconds=1) <= seen <= timezone.now(), (session.requested_at, seen)
    assert found[unknown.pk] is None  # a server the hub does not have: no activity, not an error


def test_a_hub_that_does_not_answer_gives_no_activity_rather_than_an_error(
    hub: str,
    notebook_image: NotebookImage,
    alice: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    session = running(alice, notebook_image, "unseen")
    settings.HUB_API_URL = f"http://127.0.0.1:{free_port()}/jupyter/hub/api"  # nothing listens there
    assert hub_activity([NotebookSession.objects.select_related("owner").get(pk=session.pk)]) == {}


def test_the_workers_cull_keeps_a_session_the_hub_saw_lately(
    hub: str, notebook_image: NotebookImage, alice: User
) -> None:
    session = running(alice, notebook_image, "busy")
    long_quiet(session, hours=2)  # far past the 30-minute timeout of a 1g slice, by the portal's rows alone
    assert cull_idle_sessions.delay().get(timeout=60) == {"warned": 0, "stopped": 0}
    session.refresh_from_db()
    assert session.state == State.RUNNING
    assert session.last_activity is not None and timezone.now() - session.last_activity < timedelta(minutes=10)


def test_the_workers_cull_stops_a_session_past_the_maximum_age_through_the_hub(
    hub: str, notebook_image: NotebookImage, alice: User
) -> None:
    session = running(alice, notebook_image, "ancient")
    long_quiet(session, hours=25)  # past PORTAL_MAX_SESSION_HOURS (24), however active the hub says it is
    assert cull_idle_sessions.delay().get(timeout=60) == {"warned": 0, "stopped": 1}
    wait_for(lambda: state_of(session) == State.STOPPED, 60, "the culled session to stop")
    assert session.ended_reason == NotebookSession.EndReason.MAX_AGE
    assert DockerRuntime().containers_for("session", str(session.pk)) == []
    assert session.slice is not None and not Slice.objects.get(pk=session.slice.pk).active
