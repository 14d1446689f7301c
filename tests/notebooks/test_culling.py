"""Idle culling: a warning first, then the stop; expensive slices sooner; exemptions; the maximum age."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.culling import cull, idle_timeout
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, record_event, start_session
from tests.factories import session_minute

pytestmark = pytest.mark.django_db
State = NotebookSession.State


def running(user: User, image: NotebookImage, request: SliceRequest, name: str = "lab") -> NotebookSession:
    session = start_session(user, Launch(request, image.pk, name))
    record_event(session.pk, "container_started", container_id="c")
    return record_event(session.pk, "ready")


def test_expensive_slices_have_a_shorter_idle_timeout(notebook_image: NotebookImage, alice: User) -> None:
    small = running(alice, notebook_image, SliceRequest("mig", "1g.18gb"), "small")
    whole = running(alice, notebook_image, SliceRequest("whole"), "whole")
    assert idle_timeout(small) == timedelta(minutes=30)
    assert idle_timeout(whole) == timedelta(minutes=20)


def test_an_idle_session_is_warned_first_then_stopped(notebook_image: NotebookImage, alice: User) -> None:
    session = running(alice, notebook_image, SliceRequest("mig", "1g.18gb"))
    last = timezone.now()
    assert cull({session.pk: last}, now=last + timedelta(minutes=10)) == {"warned": 0, "stopped": 0}
    assert cull({session.pk: last}, now=last + timedelta(minutes=26)) == {"warned": 1, "stopped": 0}
    session.refresh_from_db()
    assert "will be stopped at" in session.warning and "because it is idle" in session.warning
    client = Client()
    client.force_login(alice)
    assert session.warning in client.get("/").content.decode()
    assert cull({session.pk: last}, now=last + timedelta(minutes=27)) == {"warned": 0, "stopped": 0}
    assert cull({session.pk: last}, now=last + timedelta(minutes=31)) == {"warned": 0, "stopped": 1}
    session.refresh_from_db()
    assert session.state == State.STOPPING
    assert session.ended_reason == NotebookSession.EndReason.IDLE


def test_activity_keeps_a_session_alive(notebook_image: NotebookImage, alice: User) -> None:
    session = running(alice, notebook_image, SliceRequest("mig", "1g.18gb"))
    start = timezone.now()
    assert cull({session.pk: start + timedelta(minutes=25)}, now=start + timedelta(minutes=40))["stopped"] == 0
    session.refresh_from_db()
    assert session.last_activity == start + timedelta(minutes=25)
    assert cull({session.pk: None}, now=start + timedelta(minutes=50))["stopped"] == 0
    assert cull({session.pk: None}, now=start + timedelta(minutes=56))["stopped"] == 1


def test_a_busy_gpu_keeps_a_session_alive_and_an_idle_one_does_not(
    notebook_image: NotebookImage,
    alice: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    busy = running(alice, notebook_image, SliceRequest("mig", "1g.18gb"), "busy")
    quiet = running(alice, notebook_image, SliceRequest("mig", "1g.18gb"), "quiet")
    last = timezone.now()
    later = last + timedelta(minutes=45)  # past the 30-minute timeout for both, as far as the hub knows
    minute = (later - timedelta(minutes=3)).replace(second=0, microsecond=0)
    for session, util in ((busy, 80.0), (quiet, settings.IDLE_GPU_UTIL_PERCENT - 1.0)):
        session_minute(session, minute, util)
    assert cull({busy.pk: last, quiet.pk: last}, now=later) == {"warned": 0, "stopped": 1}
    assert NotebookSession.objects.get(pk=busy.pk).state == State.RUNNING
    assert NotebookSession.objects.get(pk=busy.pk).last_activity == minute + timedelta(minutes=1)
    assert NotebookSession.objects.get(pk=quiet.pk).state != State.RUNNING


def test_staff_can_exempt_a_session_from_idle_culling_but_not_from_the_maximum_age(
    notebook_image: NotebookImage, alice: User
) -> None:
    session = running(alice, notebook_image, SliceRequest("mig", "1g.18gb"))
    NotebookSession.objects.filter(pk=session.pk).update(idle_exempt=True)
    last = timezone.now()
    assert cull({session.pk: last}, now=last + timedelta(hours=3)) == {"warned": 0, "stopped": 0}
    assert cull({session.pk: last}, now=last + timedelta(hours=23, minutes=57))["warned"] == 1
    assert cull({session.pk: last}, now=last + timedelta(hours=24, minutes=1))["stopped"] == 1
    session.refresh_from_db()
    assert session.ended_reason == NotebookSession.EndReason.MAX_AGE
