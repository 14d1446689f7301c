"""The admin's notebook pages: operators manage images and exempt a session from the idle stop there."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from portal.roles import OPERATORS, USERS
from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.culling import cull
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.factories import make_user, running_session

pytestmark = pytest.mark.django_db
SESSIONS = "/admin/notebooks/notebooksession/"
IMAGES = "/admin/notebooks/notebookimage/"


def as_user(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def bobs(notebook_image: NotebookImage, bob: User) -> NotebookSession:
    session = running_session(bob, notebook_image, SliceRequest("mig", "1g.18gb"), "bobs-lab")
    warning = "bobs-lab will be stopped at 12:00 UTC because it is idle."
    NotebookSession.objects.filter(pk=session.pk).update(warned_at=timezone.now(), warning=warning)
    return session


@pytest.mark.parametrize("who", ["operator", "superuser"])
def test_the_notebook_pages_load_for_operators(staff: User, bobs: NotebookSession, who: str) -> None:
    user = staff if who == "operator" else make_user("root", [USERS, OPERATORS], is_staff=True, is_superuser=True)
    client = as_user(user)
    index = client.get("/admin/").content.decode()
    assert "Notebook sessions" in index and "Notebook images" in index
    for path in (SESSIONS, f"{SESSIONS}{bobs.pk}/change/", IMAGES, f"{IMAGES}add/", f"{IMAGES}{bobs.image_id}/change/"):
        assert client.get(path).status_code == 200, path
    listed = client.get(SESSIONS, {"q": "bob"}).content.decode()
    assert "bobs-lab" in listed


def test_nobody_adds_or_deletes_a_session_in_the_admin(staff: User, bobs: NotebookSession) -> None:
    client = as_user(staff)
    assert client.get(f"{SESSIONS}add/").status_code == 403
    assert client.post(f"{SESSIONS}{bobs.pk}/delete/", {"post": "yes"}).status_code == 403
    assert NotebookSession.objects.filter(pk=bobs.pk).exists()


def test_a_user_gets_no_admin(alice: User) -> None:
    assert as_user(alice).get(SESSIONS).status_code == 302  # to the admin's login


def test_an_operator_exempts_a_session_and_culling_leaves_it_running(staff: User, bobs: NotebookSession) -> None:
    change = f"{SESSIONS}{bobs.pk}/change/"
    client = as_user(staff)
    assert 'name="idle_exempt"' in client.get(change).content.decode()
    # Whatever else a forged form sends, only the exemption is written.
    answer = client.post(change, {"idle_exempt": "on", "state": "stopped", "server_name": "renamed", "_save": "Save"})
    assert answer.status_code == 302
    bobs.refresh_from_db()
    assert bobs.idle_exempt and (bobs.state, bobs.server_name) == (NotebookSession.State.RUNNING, "bobs-lab")
    assert (bobs.warned_at, bobs.warning) == (None, "")  # the idle warning no longer holds
    last = timezone.now()
    assert cull({bobs.pk: last}, now=last + timedelta(hours=3)) == {"warned": 0, "stopped": 0}
    assert NotebookSession.objects.get(pk=bobs.pk).state == NotebookSession.State.RUNNING


def test_the_exemption_is_an_action_on_the_list_too(staff: User, notebook_image: NotebookImage, bob: User) -> None:
    chosen = [running_session(bob, notebook_image, SliceRequest("mig", "1g.18gb"), name).pk for name in ("one", "two")]
    client = as_user(staff)
    answer = client.post(SESSIONS, {"action": "exempt", "_selected_action": chosen}, follow=True)
    assert "2 session(s) exempted from the idle stop." in answer.content.decode()
    assert NotebookSession.objects.filter(pk__in=chosen, idle_exempt=True).count() == 2
    client.post(SESSIONS, {"action": "unexempt", "_selected_action": chosen[:1]})
    assert list(NotebookSession.objects.filter(idle_exempt=True).values_list("pk", flat=True)) == chosen[1:]


def test_an_operator_adds_an_image_people_may_then_start(
    staff: User, alice: User, notebook_image: NotebookImage
) -> None:
    form = {"name": "PyTorch", "image": "gpu-portal/pytorch:2", "description": "", "enabled": "on", "_save": "Save"}
    assert as_user(staff).post(f"{IMAGES}add/", form).status_code == 302
    assert "PyTorch" in as_user(alice).get("/sessions/").content.decode()
