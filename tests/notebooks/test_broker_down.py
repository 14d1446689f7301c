"""A launch while the Celery broker does not answer, and a stop while the hub does not, on the real stack.

The launch goes to a daphne of its own whose broker URL names a port on 127.0.0.1 where nothing listens: the
person lands on their sessions page with the session starting, never on an error page, and once the broker
answers (the test's worker reads the real one) reconciliation sends the lost start and the hub starts it. A
start sent twice starts one server. A stop the hub did not take is asked again once it is back, and the
session is charged to its container's end.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.urls import reverse

from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.hub import Hub, HubError
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, send_start_again, start_session, stop_session
from sessions.notebooks.tasks import reconcile_sessions
from sessions.runtime.docker import DockerRuntime
from tests.conftest import ARTIFACTS, HubStack
from tests.helpers import processes
from tests.helpers.waiting import state_of, wait_for
from tests.helpers.websockets import session_cookie

pytestmark = [pytest.mark.hub, pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = NotebookSession.State
MIG_OFFER = "mig:H200-SXM5-141GB:1g.18gb"


@pytest.fixture
def portal_without_broker(hub: str, notebook_image: NotebookImage) -> Iterator[str]:
    """The portal under daphne, on this run's fleet, with a broker URL where nothing listens."""
    port = processes.free_port()
    process = processes.start_daphne(
        port,
        ARTIFACTS / "logs" / "daphne-no-broker.log",
        PORTAL_CELERY_BROKER_URL=f"redis://127.0.0.1:{processes.free_port()}/0",
        PORTAL_GPU_BACKEND="simulated",
        PORTAL_SIMULATED_FLEET=settings.SIMULATED_FLEET,
    )
    yield f"http://127.0.0.1:{port}"
    processes.stop(process)


def post_form(base: str, path: str, user: User, fields: dict[str, str]) -> requests.Response:
    """A form as a browser posts it, to a portal process of its own."""
    token = secrets.token_hex(16)  # a CSRF secret: Django takes it unmasked, matched against its cookie
    return requests.post(
        base + path,
        data={**fields, "csrfmiddlewaretoken": token},
        headers={"Cookie": f"{session_cookie(user)}; csrftoken={token}"},
        allow_redirects=False,
        timeout=60,
    )


def containers_of(session: NotebookSession) -> list[str]:
    return DockerRuntime().containers_for("session", str(session.pk))


def reconciled(outcome: str) -> bool:
    """One round of reconciliation, as beat runs it, on the worker: did it do ``outcome`` once?"""
    return bool(reconcile_sessions.delay().get(timeout=60)[outcome] == 1)


def test_a_launch_while_the_broker_is_down_shows_it_starting_and_reconciliation_starts_it_once_it_answers(
    portal_without_broker: str, notebook_image: NotebookImage, alice: User
) -> None:
    fields = {"offer": MIG_OFFER, "image": str(notebook_image.pk), "server_name": "unsent"}
    answer = post_form(portal_without_broker, reverse("session-launch"), alice, fields)

    assert answer.status_code == 302, answer.text[-2000:]
    assert answer.headers["Location"] == reverse("session-list")
    cookies = f"{session_cookie(alice)}; messages={answer.cookies.get('messages', '')}"
    page = requests.get(portal_without_broker + reverse("session-list"), headers={"Cookie": cookies}, timeout=30)
    session = NotebookSession.objects.get(owner=alice, server_name="unsent")
    assert page.status_code == 200
    assert "Starting unsent: this takes a few seconds." in page.text
    card = page.text.split(f'id="session-{session.pk}"')[1].split("</article>")[0]
    assert '<span class="badge warn" data-testid="state">Starting</span>' in card
    assert session.state == State.STARTING and session.start_sent_at is None, "the send was lost, and it shows"
    assert session.slice is not None and Slice.objects.get(pk=session.slice.pk).active

    wait_for(lambda: reconciled("starts_sent"), 90, "reconciliation to send the lost start")

    wait_for(lambda: state_of(session) == State.RUNNING, 120, "the session to run")
    assert session.start_sent_at is not None
    assert len(containers_of(session)) == 1
    assert Hub().started_with("alice", "unsent", {"session": session.pk})
    assert reconcile_sessions.delay().get(timeout=60)["starts_sent"] == 0
    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == State.STOPPED, 60, "the session to stop")


def test_a_start_sent_twice_starts_one_server_and_asking_the_hub_again_is_no_refusal(
    hub: str, notebook_image: NotebookImage, alice: User
) -> None:
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "twice"))
    send_start_again(session.pk)  # as reconciliation would, had it taken the first for lost

    wait_for(lambda: state_of(session) == State.RUNNING, 120, "the session to run")
    # Once it runs, the hub answers a start with 400: for the same session that is no refusal.
    Hub().start_server("alice", "twice", {"session": session.pk})
    with pytest.raises(HubError, match="HTTP 400"):  # another session's options are one
        Hub().start_server("alice", "twice", {"session": session.pk + 1})
    assert state_of(session) == State.RUNNING
    assert len(containers_of(session)) == 1
    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == State.STOPPED, 60, "the session to stop")
    assert session.ended_reason == NotebookSession.EndReason.USER and not session.failure_message


def test_a_stop_the_hub_did_not_take_is_asked_again_once_it_is_back_and_charged_to_the_containers_end(
    portal_without_broker: str, hub_stack: HubStack, notebook_image: NotebookImage, alice: User
) -> None:
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "unstopped"))
    wait_for(lambda: state_of(session) == State.RUNNING, 120, "the session to run")
    hub_stack.stop()
    try:
        answer = post_form(portal_without_broker, reverse("session-stop", args=[session.pk]), alice, {})
        assert answer.status_code == 302, answer.text[-2000:]
        assert state_of(session) == State.STOPPING and session.stop_sent_at is None
        assert reconcile_sessions.delay().get(timeout=60)["stops_sent"] == 0  # the hub still does not answer
        assert DockerRuntime().container_state(session.pk).running  # type: ignore[union-attr]
    finally:
        hub_stack.start()

    wait_for(lambda: reconciled("stops_sent"), 60, "reconciliation to ask the hub again")

    wait_for(lambda: state_of(session) == State.STOPPED, 60, "the session to stop")
    wait_for(lambda: containers_of(session) == [], 30, "its container's removal")
    assert session.stop_sent_at is not None
    assert session.ended_reason == NotebookSession.EndReason.USER
    assert session.container_started_at is not None and session.container_gone_at is not None
    died = DockerRuntime().died_at(session.pk, since=session.container_started_at)
    assert died is not None and abs((session.container_gone_at - died).total_seconds()) < 0.2
    assert session.slice is not None
    held = Slice.objects.get(pk=session.slice.pk)
    assert not held.active and held.held_until == session.container_gone_at
