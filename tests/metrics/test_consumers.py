"""Metric sockets: who may watch what, bad messages, the per-person cap, stale frames dropped."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from portal import push
from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session
from tests.helpers.websockets import open_socket

pytestmark = pytest.mark.django_db(transaction=True)


async def send_frame(group: str, frame: dict[str, object], age_s: float = 0.0) -> None:
    t = time.time() - age_s
    await push.publish_frame(push.metrics_layer(), group, json.dumps({**frame, "t": t}), t, "test")


async def a_session(user: User, image: NotebookImage, name: str) -> NotebookSession:
    launch = Launch(SliceRequest("mig", "1g.18gb"), image.pk, name)
    session: NotebookSession = await database_sync_to_async(start_session)(user, launch)
    return session


async def test_nobody_logged_out_and_no_non_staff_watch_the_fleet(alice: User, staff: User) -> None:
    _, open_, code = await open_socket("/ws/metrics/fleet/")
    assert (open_, code) == (False, 4401)
    _, open_, code = await open_socket("/ws/metrics/fleet/", alice)
    assert (open_, code) == (False, 4403)
    socket, open_, _ = await open_socket("/ws/metrics/fleet/", staff)
    assert open_
    await send_frame(push.fleet_metrics_group(), {"kind": "fleet", "gpus": []})
    assert json.loads(await socket.receive_from(timeout=5))["kind"] == "fleet"
    await socket.disconnect()


async def test_a_session_stream_is_for_its_owner_and_staff_only(
    notebook_image: NotebookImage, alice: User, bob: User, staff: User
) -> None:
    session = await a_session(alice, notebook_image, "mine")
    path = f"/ws/metrics/sessions/{session.pk}/"
    _, open_, code = await open_socket(path, bob)
    assert (open_, code) == (False, 4403), "bob may not watch alice's session"
    _, open_, code = await open_socket("/ws/metrics/sessions/999999/", bob)
    assert (open_, code) == (False, 4403), "a session that does not exist looks the same as someone else's"
    alice_socket, open_, _ = await open_socket(path, alice)
    staff_socket, staff_open, _ = await open_socket(path, staff)
    bob_socket, _, _ = await open_socket("/ws/metrics/mine/", bob)
    assert open_ and staff_open
    await send_frame(
        push.user_metrics_group(alice.pk), {"kind": "mine", "devices": [{"session": session.pk, "util": 50}]}
    )
    for socket in (alice_socket, staff_socket):
        assert json.loads(await socket.receive_from(timeout=5))["devices"][0]["session"] == session.pk
    assert await bob_socket.receive_nothing(timeout=0.5), "bob's own stream carries nothing of alice's"
    for socket in (alice_socket, staff_socket, bob_socket):
        await socket.disconnect()


async def test_bad_messages_get_an_error_and_ping_a_pong(alice: User) -> None:
    socket, _, _ = await open_socket("/ws/metrics/mine/", alice)
    for bad in ("not json", json.dumps({"type": "subscribe", "session": 1}), json.dumps([1, 2])):
        await socket.send_to(text_data=bad)
        assert json.loads(await socket.receive_from(timeout=5))["type"] == "error"
    await socket.send_to(text_data=json.dumps({"type": "ping"}))
    assert json.loads(await socket.receive_from(timeout=5)) == {"type": "pong", "dropped": 0}
    await socket.disconnect()


async def test_stale_frames_are_dropped_not_sent_late(alice: User) -> None:
    socket, _, _ = await open_socket("/ws/metrics/mine/", alice)
    await send_frame(push.user_metrics_group(alice.pk), {"kind": "mine", "devices": [], "n": 1}, age_s=10)
    await send_frame(push.user_metrics_group(alice.pk), {"kind": "mine", "devices": [], "n": 2})
    assert json.loads(await socket.receive_from(timeout=5))["n"] == 2
    await socket.send_to(text_data=json.dumps({"type": "ping"}))
    assert json.loads(await socket.receive_from(timeout=5)) == {"type": "pong", "dropped": 1}
    await socket.disconnect()


async def test_one_person_cannot_open_sockets_without_end(alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.METRICS_SOCKETS_PER_USER = 3
    sockets = []
    for _ in range(3):
        socket, open_, _ = await open_socket("/ws/metrics/mine/", alice)
        assert open_
        sockets.append(socket)
    _, open_, code = await open_socket("/ws/metrics/mine/", alice)
    assert (open_, code) == (False, 4429)
    await sockets.pop().disconnect()
    another, open_, _ = await open_socket("/ws/metrics/mine/", alice)
    assert open_, "closing one makes room for another"
    for socket in [*sockets, another]:
        await socket.disconnect()


async def test_a_frame_sent_on_connecting_is_not_sent_again_through_the_group(staff: User) -> None:
    """The newest frame goes out at once on connecting; if the same tick then arrives through the group
    (it was published while the socket joined), the browser must not get it twice."""
    import redis.asyncio as aioredis
    from django.conf import settings

    from sessions.metrics.agent import latest_key
    from sessions.metrics.frames import dumps

    t = time.time()
    frame = {"kind": "fleet", "agent": "dedupe", "t": t, "gpus": []}
    store = aioredis.from_url(settings.REDIS_URL)
    await store.delete(latest_key())
    await store.hset(latest_key(), "dedupe", dumps(frame))
    try:
        socket = await fleet_socket(staff)
        assert json.loads(await socket.receive_from(timeout=5))["t"] == t  # on connecting
        layer = push.metrics_layer()
        await push.publish_frames(layer, dumps(frame), {}, t, "dedupe")  # the same tick, late
        await push.publish_frames(layer, dumps({**frame, "t": t + 1}), {}, t + 1, "dedupe")
        assert json.loads(await socket.receive_from(timeout=5))["t"] == t + 1  # the next one, not a repeat
        assert await socket.receive_nothing(timeout=0.5)
        await socket.disconnect()
    finally:
        await store.delete(latest_key())
        await store.aclose()


async def test_a_quiet_agent_s_last_frame_reaches_a_new_socket_marked_stale(staff: User) -> None:
    """The latest frame of an agent that stopped 20 s ago is still in Redis: a page opening now gets it as
    stale, with its age, never as live."""
    import redis.asyncio as aioredis
    from django.conf import settings

    from sessions.metrics.agent import latest_key
    from sessions.metrics.frames import dumps

    frame = {"kind": "fleet", "agent": "quiet", "t": time.time() - 20, "gpus": []}
    store = aioredis.from_url(settings.REDIS_URL)
    await store.delete(latest_key())
    await store.hset(latest_key(), "quiet", dumps(frame))
    try:
        socket = await fleet_socket(staff)
        sent = json.loads(await socket.receive_from(timeout=5))
        assert sent["agent"] == "quiet" and sent["stale"] is True and sent["age"] >= 20
        await socket.disconnect()
    finally:
        await store.delete(latest_key())
        await store.aclose()


async def fleet_socket(staff: User) -> Any:
    """The fleet stream's socket, opened as ``staff`` through the whole ASGI application, connected."""
    from channels.testing import WebsocketCommunicator

    from portal.asgi import application
    from tests.helpers.websockets import session_cookie

    cookie = await database_sync_to_async(session_cookie)(staff)
    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000"), (b"cookie", cookie.encode())]
    socket = WebsocketCommunicator(application, "/ws/metrics/fleet/", headers=headers)
    assert (await socket.connect(timeout=5))[0]
    return socket
