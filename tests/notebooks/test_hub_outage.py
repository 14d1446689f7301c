"""A start while the hub does not answer: the portal keeps asking for a while, says so, and never shows
an exception's text to the person waiting."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import WAITING_FOR_HUB, Launch, ask_hub_to_start, start_session
from tests.conftest import HubStack
from tests.helpers.processes import free_port
from tests.helpers.waiting import state_of, wait_for

MIG = SliceRequest("mig", "1g.18gb")


@pytest.fixture
def silent_hub(settings) -> None:  # type: ignore[no-untyped-def]
    """The hub's address with nothing listening there, as while it restarts."""
    settings.HUB_API_URL = f"http://127.0.0.1:{free_port()}/jupyter/hub/api"


@pytest.mark.django_db
def test_a_start_waits_for_a_silent_hub_with_growing_pauses(
    silent_hub: None, notebook_image: NotebookImage, alice: User
) -> None:
    session = start_session(alice, Launch(MIG, notebook_image.pk, "patient"))
    pauses = [ask_hub_to_start(session.pk, attempt=n) for n in range(7)]
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    session.refresh_from_db()
    assert session.state == NotebookSession.State.STARTING
    assert session.progress_message == WAITING_FOR_HUB
    assert session.slice is not None and Slice.objects.get(pk=session.slice.pk).active


@pytest.mark.django_db
def test_a_start_gives_up_on_a_silent_hub_in_words_not_a_traceback(
    silent_hub: None, settings, notebook_image: NotebookImage, alice: User
) -> None:  # type: ignore[no-untyped-def]
    session = start_session(alice, Launch(MIG, notebook_image.pk, "hopeless"))
    past = timezone.now() - timedelta(seconds=settings.HUB_START_PATIENCE_SECONDS + 1)
    NotebookSession.objects.filter(pk=session.pk).update(requested_at=past)
    assert session.slice is not None
    Slice.objects.filter(pk=session.slice.pk).update(allocated_at=past)  # patience counts from the slice
    assert ask_hub_to_start(session.pk, attempt=9) is None
    session.refresh_from_db()
    assert session.state == NotebookSession.State.FAILED
    assert session.failure_message.startswith("The notebook service did not answer for 5 minutes")
    assert "HTTPConnectionPool" in session.failure_detail
    assert session.slice is not None and not Slice.objects.get(pk=session.slice.pk).active
    client = Client()
    client.force_login(alice)
    for url in (reverse("session-list"), reverse("session-detail", args=[session.pk])):
        page = client.get(url).content.decode()
        assert "did not answer for 5 minutes" in page
        assert "HTTPConnectionPool" not in page and "Traceback" not in page and "Errno" not in page


@pytest.mark.hub
@pytest.mark.docker
@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_start_during_a_hub_outage_runs_once_the_hub_is_back(
    hub_stack: HubStack, notebook_image: NotebookImage, alice: User
) -> None:
    hub_stack.stop()
    try:
        session = start_session(alice, Launch(MIG, notebook_image.pk, "outage"))
        waiting = lambda: NotebookSession.objects.get(pk=session.pk).progress_message == WAITING_FOR_HUB  # noqa: E731
        wait_for(waiting, 30, "the card to say it waits for the hub")
        assert state_of(session) == NotebookSession.State.STARTING
    finally:
        hub_stack.start()
    wait_for(lambda: state_of(session) == NotebookSession.State.RUNNING, 120, "the session to run after the outage")
    from sessions.notebooks.services import stop_session

    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 60, "the session to stop")


@pytest.mark.django_db
def test_patience_counts_from_the_slice_not_the_request(
    silent_hub: None, settings, notebook_image: NotebookImage, alice: User
) -> None:  # type: ignore[no-untyped-def]
    """A launch handed a reclaimed spot slice waited the grace time before it asked the hub at all."""
    session = start_session(alice, Launch(MIG, notebook_image.pk, "handed"))
    past = timezone.now() - timedelta(seconds=settings.HUB_START_PATIENCE_SECONDS + 1)
    NotebookSession.objects.filter(pk=session.pk).update(requested_at=past)
    assert ask_hub_to_start(session.pk, attempt=9) == 30.0  # still patient: its slice is new
    assert state_of(session) == NotebookSession.State.STARTING
