"""Roles mean what they say: only the 'users' group (or staff) may start GPU work or see the offers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal.roles import BILLING
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, LaunchRefused, start_session
from tests.factories import make_user

pytestmark = pytest.mark.django_db

OFFER = "mig:H200-SXM5-141GB:1g.18gb"


@pytest.fixture
def nobody(roles: None) -> User:
    """An account in no group at all (created by staff in the admin, or by sign-up before it joined users)."""
    return make_user("nadia", [])


@pytest.fixture
def finance_only(roles: None) -> User:
    return make_user("fiona", [BILLING])


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture(params=["nobody", "finance_only"])
def outsider(request: pytest.FixtureRequest) -> User:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def test_someone_outside_users_sees_why_they_cannot_launch_and_whom_to_ask(
    settings, notebook_image: NotebookImage, outsider: User
) -> None:  # type: ignore[no-untyped-def]
    settings.ACCESS_CONTACT = "gpu-admins@example.org"
    page = client_for(outsider).get("/sessions/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "not in the &#x27;users&#x27; group" in text and "Ask gpu-admins@example.org to add you." in text
    assert "Start JupyterLab" not in text
    assert "1g.18gb" not in text  # the offers (what is free where) are not shown either


def test_someone_outside_users_cannot_launch_by_posting_the_form(notebook_image: NotebookImage, outsider: User) -> None:
    answer = client_for(outsider).post(
        "/sessions/launch/", {"offer": OFFER, "image": notebook_image.pk, "server_name": "sneaky"}
    )
    assert answer.status_code == 403
    assert "cannot start GPU sessions" in answer.content.decode()
    assert not NotebookSession.objects.exists()
    assert not Slice.objects.exists()


def test_the_service_itself_refuses_someone_outside_users(notebook_image: NotebookImage, outsider: User) -> None:
    with pytest.raises(LaunchRefused) as refused:
        start_session(outsider, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "direct"))
    assert refused.value.code == "role"
    assert "Ask an operator of this portal to add you." in refused.value.reason
    assert not Slice.objects.exists()


def test_someone_outside_users_is_told_on_the_render_page(outsider: User) -> None:
    text = client_for(outsider).get("/sessions/render-jobs/").content.decode()
    assert "cannot start GPU sessions or render jobs" in text


def test_a_member_of_users_sees_the_form_and_no_refusal(notebook_image: NotebookImage, alice: User) -> None:
    text = client_for(alice).get("/sessions/").content.decode()
    assert "Start JupyterLab" in text and "1g.18gb" in text
    assert "cannot start" not in text
    assert "cannot start" not in client_for(alice).get("/sessions/render-jobs/").content.decode()


def test_staff_may_launch_without_being_in_users(notebook_image: NotebookImage, roles: None) -> None:
    operator = make_user("olga", [], is_staff=True)
    session = start_session(operator, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "ops"))
    assert session.slice is not None


def test_someone_removed_from_users_can_still_stop_their_running_session(
    notebook_image: NotebookImage, alice: User
) -> None:
    """Losing the right to start must not trap a session that is already costing money."""
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "keep"))
    alice.groups.clear()
    answer = client_for(alice).post(f"/sessions/{session.pk}/stop/")
    assert answer.status_code == 302
    session.refresh_from_db()
    assert session.state == NotebookSession.State.STOPPING
