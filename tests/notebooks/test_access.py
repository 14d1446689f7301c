"""Nobody reaches someone else's session or slice by any route; operators may view and stop anyone's.

Someone else's session answers exactly as one that does not exist, so nobody learns what others run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.test import Client
from django.urls import reverse

from sessions import access
from sessions.access import Action
from sessions.gpus.allocator import SliceRequest
from sessions.notebooks import access as notebook_access
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, LaunchRefused, start_session, stop_session
from tests.factories import running_session
from tests.helpers.websockets import open_socket

NO_SUCH = 999_999


def as_user(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def hub_client() -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {settings.HUB_SERVICE_TOKEN}")


@pytest.fixture
def bobs(notebook_image: NotebookImage, bob: User) -> NotebookSession:
    return running_session(bob, notebook_image, SliceRequest("mig", "1g.18gb"), "bobs-lab")


def still_running(session: NotebookSession) -> bool:
    session.refresh_from_db()
    return session.state == NotebookSession.State.RUNNING and session.ended_reason == ""


@pytest.mark.django_db
def test_someone_elses_session_page_is_a_404_like_one_that_does_not_exist(alice: User, bobs: NotebookSession) -> None:
    client = as_user(alice)
    theirs, missing = (client.get(reverse("session-detail", args=[pk])) for pk in (bobs.pk, NO_SUCH))
    assert theirs.status_code == missing.status_code == 404
    assert "bobs-lab" not in theirs.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
def test_nobody_stops_someone_elses_session_with_the_form_or_htmx(
    alice: User, bobs: NotebookSession, htmx: bool
) -> None:
    headers = {"HX-Request": "true", "HX-Target": "all-sessions"} if htmx else {}
    client = as_user(alice)
    for pk in (bobs.pk, NO_SUCH):
        assert client.post(reverse("session-stop", args=[pk]), {"back": "all"}, headers=headers).status_code == 404
    assert still_running(bobs)


@pytest.mark.django_db
def test_the_service_refuses_a_stop_by_someone_else(alice: User, bobs: NotebookSession) -> None:
    with pytest.raises(LaunchRefused, match="No such session among yours"):
        stop_session(bobs.pk, by=alice)
    assert still_running(bobs)


@pytest.mark.django_db
def test_the_hub_cannot_report_for_one_person_about_someone_elses_session(alice: User, bobs: NotebookSession) -> None:
    def report(user: str, session_id: int) -> int:
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # as Docker writes FinishedAt
        body = json.dumps({"session": session_id, "user": user, "event": "stopped", "exit_code": 0, "at": at})
        return hub_client().post(reverse("notebook-events"), body, content_type="application/json").status_code

    assert report("alice", bobs.pk) == report("alice", NO_SUCH) == report("", bobs.pk) == 404
    assert still_running(bobs)
    no_user = json.dumps({"session": bobs.pk, "event": "stopped"})
    answer = hub_client().post(reverse("notebook-events"), no_user, content_type="application/json")
    assert answer.status_code == 400 and "'user'" in answer.json()["error"]
    assert report("bob", bobs.pk) == 200  # its owner's server did stop: that is recorded
    bobs.refresh_from_db()
    assert bobs.state == NotebookSession.State.STOPPED


@pytest.mark.django_db
def test_the_hub_gets_no_launch_spec_for_someone_elses_session(alice: User, notebook_image: NotebookImage) -> None:
    start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "shared-name"))
    spec = reverse("notebook-launch-spec")
    assert hub_client().get(spec, {"user": "bob", "server": "shared-name"}).status_code == 404
    assert hub_client().get(spec, {"user": "alice", "server": "shared-name"}).status_code == 200


@pytest.mark.django_db(transaction=True)
async def test_nobody_watches_someone_elses_session_and_cannot_tell_it_exists(
    alice: User, bobs: NotebookSession
) -> None:
    _, theirs_open, theirs_code = await open_socket(f"/ws/metrics/sessions/{bobs.pk}/", alice)
    _, missing_open, missing_code = await open_socket(f"/ws/metrics/sessions/{NO_SUCH}/", alice)
    assert (theirs_open, theirs_code) == (missing_open, missing_code) == (False, 4403)


@pytest.mark.django_db(transaction=True)
async def test_an_operator_watches_anyones_session(staff: User, bobs: NotebookSession) -> None:
    socket, open_, _ = await open_socket(f"/ws/metrics/sessions/{bobs.pk}/", staff)
    assert open_
    await socket.disconnect()


@pytest.mark.django_db
def test_an_operator_sees_and_stops_anyones_session_and_its_owner_reads_who_did(
    staff: User, bobs: NotebookSession
) -> None:
    client = as_user(staff)
    assert "bobs-lab" in client.get(reverse("session-detail", args=[bobs.pk])).content.decode()
    assert client.post(reverse("session-stop", args=[bobs.pk])).status_code == 302
    bobs.refresh_from_db()
    assert bobs.state == NotebookSession.State.STOPPING
    assert bobs.get_ended_reason_display() == "Stopped by an operator"


@pytest.mark.django_db
def test_an_owner_stopping_their_own_session_is_recorded_as_theirs(bob: User, bobs: NotebookSession) -> None:
    assert as_user(bob).post(reverse("session-stop", args=[bobs.pk])).status_code == 302
    bobs.refresh_from_db()
    assert bobs.ended_reason == NotebookSession.EndReason.USER


@pytest.mark.django_db
def test_the_rule_for_sessions_and_slices(alice: User, bob: User, staff: User, bobs: NotebookSession) -> None:
    taken = bobs.slice
    assert taken is not None
    nobody = AnonymousUser()
    cases: list[tuple[User | AnonymousUser, Action, bool]] = [
        (bob, Action.VIEW, True),
        (bob, Action.STOP, True),
        (bob, Action.HUB, True),
        (staff, Action.VIEW, True),
        (staff, Action.STOP, True),
        (staff, Action.HUB, False),  # an operator never acts as the owner
        (alice, Action.VIEW, False),
        (alice, Action.STOP, False),
        (nobody, Action.VIEW, False),
    ]
    for person, action, allowed in cases:
        assert access.may(person, action, bobs) is allowed, (person, action)
        assert notebook_access.sessions_for(person, action).filter(pk=bobs.pk).exists() is allowed, (person, action)
    assert notebook_access.session_for(staff, bobs.pk, Action.STOP) == bobs
    with pytest.raises(access.NotFound):
        notebook_access.session_for(alice, bobs.pk)
    people: list[tuple[User | AnonymousUser, bool]] = [(bob, True), (staff, True), (alice, False), (nobody, False)]
    for person, allowed in people:
        assert access.slices_for(person, Action.RELEASE).filter(pk=taken.pk).exists() is allowed, person
        assert access.may(person, Action.RELEASE, taken) is allowed, person
    assert access.slice_for(bob, taken.pk) == taken
    with pytest.raises(access.NotFound, match="No such slice among yours"):
        access.slice_for(alice, taken.pk, Action.RELEASE)
