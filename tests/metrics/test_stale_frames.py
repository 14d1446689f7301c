"""A quiet agent's last figures are shown as stale, never as live (issue 31, item 2): the latest frames the
portal serves (the live fleet's JSON, a socket's first frames) say so with their age, and the page greys them."""

from __future__ import annotations

import json
import time

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from sessions.metrics.agent import latest_key
from sessions.metrics.frames import STALE_AFTER_S, marked_if_stale


def frame(agent: str, t: float) -> str:
    return json.dumps({"kind": "fleet", "agent": agent, "t": round(t, 3), "simulated": True, "gpus": []})


def test_a_frame_older_than_the_bound_is_marked_stale_with_its_age_and_a_young_one_is_left_alone() -> None:
    now = time.time()
    young, old = frame("a", now - STALE_AFTER_S + 1), frame("b", now - 42)
    assert marked_if_stale(young, now) == young
    marked = json.loads(marked_if_stale(old, now))
    assert marked["stale"] is True and 41.9 <= marked["age"] <= 42.1 and marked["agent"] == "b"


@pytest.mark.django_db
def test_the_live_fleet_json_marks_a_quiet_agent_s_frame_stale(store: redis.Redis, staff: User) -> None:
    now = time.time()
    store.hset(latest_key(), mapping={"live": frame("live", now), "quiet": frame("quiet", now - 30)})
    client = Client()
    client.force_login(staff)
    frames = {f["agent"]: f for f in client.get(reverse("fleet-latest")).json()["frames"]}
    assert "stale" not in frames["live"]
    assert frames["quiet"]["stale"] is True and frames["quiet"]["age"] >= 30
