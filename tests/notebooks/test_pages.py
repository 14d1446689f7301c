"""The Sessions page: offers with availability, the launch form's refusals, stop, htmx partials."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession

pytestmark = pytest.mark.django_db
MIG_OFFER = "mig:H200-SXM5-141GB:1g.18gb"


def as_user(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def launch(client: Client, image: NotebookImage, offer: str = MIG_OFFER, name: str = "lab"):  # type: ignore[no-untyped-def]
    return client.post(reverse("session-launch"), {"offer": offer, "image": image.pk, "server_name": name})


def test_the_page_offers_each_slice_with_what_is_free_and_its_price(notebook_image: NotebookImage, alice: User) -> None:
    page = as_user(alice).get(reverse("session-list")).content.decode()
    assert "H200-SXM5-141GB · MIG 1g.18gb (16 GiB) — 7 free — 3.00 CNY/h, spot 1.20 CNY/h (simulated)" in page
    assert "H200-SXM5-141GB · MIG 7g.141gb (139.75 GiB) — 1 free — 20.97 CNY/h, spot 8.39 CNY/h (simulated)" in page
    assert "L4-24GB · whole GPU (24 GiB) — 1 free — 2.92 CNY/h, spot 1.17 CNY/h (simulated)" in page
    assert "No sessions yet" in page


def test_a_launch_from_the_form_starts_a_session(notebook_image: NotebookImage, alice: User) -> None:
    client = as_user(alice)
    response = launch(client, notebook_image)
    assert response.status_code == 302
    session = NotebookSession.objects.get(owner=alice)
    assert session.state == NotebookSession.State.STARTING
    page = client.get(reverse("session-list")).content.decode()
    assert "<progress" in page and 'hx-trigger="sessions-changed from:body, every 3s"' in page
    assert "1g.18gb at memory slice" in page


def test_a_refused_launch_says_why_on_the_form_and_allocates_nothing(
    notebook_image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.MAX_SLICES_PER_USER = 0
    response = launch(as_user(alice), notebook_image)
    assert response.status_code == 200
    assert "your limit" in response.content.decode()
    assert not Slice.objects.exists() and not NotebookSession.objects.exists()


@pytest.mark.parametrize("offer", ["mig:H200-SXM5-141GB:", "gpu:everything:", "mig:H9000:1g.1gb", "whole:L4-24GB:x"])
def test_a_forged_offer_is_refused(notebook_image: NotebookImage, alice: User, offer: str) -> None:
    response = launch(as_user(alice), notebook_image, offer=offer)
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode() or "Pick one of" in response.content.decode()
    assert not NotebookSession.objects.exists()


def test_a_session_name_with_odd_characters_is_refused_on_the_form(notebook_image: NotebookImage, alice: User) -> None:
    response = launch(as_user(alice), notebook_image, name="../../etc")
    assert response.status_code == 200
    assert "Enter a valid" in response.content.decode()
    assert not NotebookSession.objects.exists()


def test_nobody_stops_another_users_session_from_the_page(
    notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    launch(as_user(alice), notebook_image)
    session = NotebookSession.objects.get(owner=alice)
    assert as_user(bob).post(reverse("session-stop", args=[session.pk])).status_code == 404
    cards = as_user(bob).get(reverse("session-list")).content.decode().split("Your sessions")[1]
    assert "lab" not in cards.split('id="storage"')[0]  # the storage section after the cards has aria-labels
    session.refresh_from_db()
    assert session.state == NotebookSession.State.STARTING


def test_htmx_polls_get_only_the_cards(notebook_image: NotebookImage, alice: User) -> None:
    client = as_user(alice)
    launch(client, notebook_image)
    page = client.get(reverse("session-list"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="session-cards").content.decode()
    assert page.lstrip().startswith('<section id="session-cards"')
    assert "<html" not in page


def ended(session: NotebookSession, end: object) -> NotebookSession:
    from sessions.notebooks.services import ContainerEnd, record_event

    assert isinstance(end, ContainerEnd)
    record_event(session.pk, "container_started", container_id="abc")
    record_event(session.pk, "ready")
    return record_event(session.pk, "stopped", end=end)


def test_an_ended_sessions_page_says_when_and_why_it_ended(notebook_image: NotebookImage, alice: User) -> None:
    from sessions.notebooks.services import ContainerEnd

    client = as_user(alice)
    launch(client, notebook_image)
    session = ended(NotebookSession.objects.get(owner=alice), ContainerEnd(exit_code=0))
    page = client.get(reverse("session-detail", args=[session.pk])).content.decode()
    assert session.ended_at is not None
    ended_row = page.split("<dt>Ended</dt>", 1)[1].split("</dd>", 1)[0]
    assert "—" not in ended_row and "Shut down from inside JupyterLab" in ended_row


def test_a_crashed_session_does_not_look_like_a_normal_stop(
    notebook_image: NotebookImage, alice: User, staff: User
) -> None:
    from sessions.notebooks.services import ContainerEnd

    client = as_user(alice)
    launch(client, notebook_image)
    session = ended(NotebookSession.objects.get(owner=alice), ContainerEnd(exit_code=137, oom_killed=True))
    cards = client.get(reverse("session-list")).content.decode()
    assert '<span class="badge bad" data-testid="state">Crashed</span>' in cards
    assert "ran out of memory" in cards
    assert ">Stopped<" not in cards
    mine = client.get(reverse("session-detail", args=[session.pk])).content.decode()
    assert "Crashed" in mine and "OOM killed" not in mine  # the technical detail is for operators
    theirs = as_user(staff).get(reverse("session-detail", args=[session.pk])).content.decode()
    assert "OOM killed True" in theirs


def test_a_start_stuck_at_one_step_says_so_on_the_card(settings, notebook_image: NotebookImage, alice: User) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.utils import timezone

    client = as_user(alice)
    launch(client, notebook_image)
    session = NotebookSession.objects.get(owner=alice)
    assert "This step has taken" not in client.get(reverse("session-list")).content.decode()
    NotebookSession.objects.filter(pk=session.pk).update(
        progress_at=timezone.now() - timedelta(seconds=settings.SLOW_STEP_SECONDS + 5)
    )
    assert "This step has taken 1\xa0minute so far" in client.get(reverse("session-list")).content.decode()
