"""Across processes: the agent samples, Redis carries, daphne forwards, the owner's socket receives.

Each person receives their own session's slice and never anyone else's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio
import websockets
from django.conf import settings
from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest
from sessions.metrics.agent import latest_key
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.conftest import ARTIFACTS
from tests.factories import running_session
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.websockets import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)
FLEET = "live: 2xH200:mig"


@pytest.fixture
def fleet(settings) -> None:
    use_fleet(settings, FLEET)


@pytest.fixture
def agent(fleet: None) -> Iterator[None]:
    process = processes.start_gpu_agent(FLEET, ARTIFACTS / "logs" / "gpu-agent.log")
    yield
    processes.stop(process)


def running(user: User, image: NotebookImage, name: str) -> NotebookSession:
    session = running_session(user, image, SliceRequest("mig", "1g.18gb", host="live"), name)
    assert session.slice is not None  # loaded here, where the database may be used
    return session


async def agent_sees(*sessions: int) -> None:
    """Wait until the agent has picked up who holds what (it re-reads the slices every 2 s)."""
    store = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    latest: list[bytes] = []
    try:
        for _ in range(100):
            latest = [v if isinstance(v, bytes) else v.encode() for v in (await store.hgetall(latest_key())).values()]
            if all(f'"session":{number}'.encode() in b"".join(latest) for number in sessions):
                return
            await asyncio.sleep(0.1)
    finally:
        await store.aclose()
    raise AssertionError(f"the agent never showed sessions {sessions}: {latest!r:.2000}")


async def frames(url: str, cookie: str, seconds: float) -> list[tuple[float, dict[str, Any]]]:
    """Every frame a socket receives for a while, with the moment it arrived."""
    received: list[tuple[float, dict[str, Any]]] = []
    headers = {"Cookie": cookie, "Origin": "http://127.0.0.1:8000"}
    async with websockets.connect(url, additional_headers=headers) as socket:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                text = await asyncio.wait_for(socket.recv(), timeout=left)
            except TimeoutError:
                break
            received.append((time.time(), json.loads(text)))
    return received


async def test_each_owner_receives_their_own_slice_and_never_another_persons(
    portal_server: str, notebook_image: NotebookImage, alice: User, bob: User, fleet: None, agent: None
) -> None:
    from channels.db import database_sync_to_async

    mine = await database_sync_to_async(running)(alice, notebook_image, "mine")
    theirs = await database_sync_to_async(running)(bob, notebook_image, "theirs")
    alice_cookie = await database_sync_to_async(session_cookie)(alice)
    await agent_sees(mine.pk, theirs.pk)
    base = portal_server.replace("http://", "ws://")
    got = await frames(f"{base}/ws/metrics/sessions/{mine.pk}/", alice_cookie, 3.0)
    with_mine = [(arrived, frame) for arrived, frame in got if any(d["session"] == mine.pk for d in frame["devices"])]
    assert len(with_mine) >= 3, f"the agent ticks every 250 ms; got {len(got)} frames"
    for arrived, frame in got:
        assert frame["kind"] == "mine"
        devices = frame["devices"]
        assert {d["uuid"] for d in devices} == {mine.slice.device_uuid}  # type: ignore[union-attr]
        assert theirs.slice is not None and theirs.slice.device_uuid not in json.dumps(frame)
        assert arrived - float(frame["t"]) < 1.0, "a frame arrives within a second of its sample"
    device = with_mine[-1][1]["devices"][0]
    assert device["profile"] == "1g.18gb" and device["model"] == "H200-SXM5-141GB"
    assert device["util"] == 0.0 and device["temp"] is not None, "nothing runs there: an idle GPU"
