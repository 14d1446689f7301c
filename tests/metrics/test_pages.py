"""The pages around live metrics: a session's page with its history, the JSON of the latest frames."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from sessions.gpus.allocator import SliceRequest
from sessions.metrics.agent import latest_key
from sessions.notebooks.models import NotebookImage
from sessions.notebooks.services import Launch, start_session
from tests.factories import session_minute

pytestmark = pytest.mark.django_db


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_session_page_shows_its_whole_history_to_its_owner_only(
    notebook_image: NotebookImage, alice: User, bob: User, staff: User
) -> None:
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "hist"))
    for minute, util in ((0, 10.0), (1, 80.0)):
        session_minute(session, datetime(2026, 11, 30, 9, minute, tzinfo=UTC), util, power_mean=100.0)
    page = client_for(alice).get(f"/sessions/{session.pk}/")
    assert page.status_code == 200
    history = page.context["history"]
    assert [point["util"] for point in history] == [10.0, 80.0]
    assert b'id="session-history"' in page.content and b"data-live-session" in page.content
    assert client_for(bob).get(f"/sessions/{session.pk}/").status_code == 404
    assert client_for(staff).get(f"/sessions/{session.pk}/").status_code == 200


def test_the_latest_frames_as_json_are_for_staff(alice: User, staff: User) -> None:
    store = redis.Redis.from_url(settings.REDIS_URL)
    store.hset(latest_key(), "sim-a", json.dumps({"kind": "fleet", "agent": "sim-a", "t": 1.0, "gpus": []}))
    try:
        assert client_for(alice).get("/sessions/fleet/live.json").status_code == 403
        answer = client_for(staff).get("/sessions/fleet/live.json")
        assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
        assert [frame["agent"] for frame in answer.json()["frames"]] == ["sim-a"]
    finally:
        store.delete(latest_key())
