"""Websockets: authenticated, origin-checked, fed through the Redis channel layer."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import User

from portal import push
from portal.consumers import CLOSE_UNAUTHENTICATED
from tests.helpers.websockets import open_socket, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_channel_layer_is_redis() -> None:
    assert type(get_channel_layer()).__module__.startswith("channels_redis")


async def test_a_connect_without_a_session_is_refused() -> None:
    _, accepted, code = await open_socket("/ws/notifications/")
    assert not accepted
    assert code == CLOSE_UNAUTHENTICATED


async def test_a_connect_from_another_origin_is_refused(alice: User) -> None:
    _, accepted, _ = await open_socket("/ws/notifications/", alice, origin="http://evil.example")
    assert not accepted


async def test_an_unknown_route_is_refused(alice: User) -> None:
    with pytest.raises(ValueError, match="No route found"):
        await open_socket("/ws/nowhere/", alice)


async def test_ping_gets_pong_and_bad_messages_get_an_error(alice: User) -> None:
    communicator, accepted, _ = await open_socket("/ws/notifications/", alice)
    assert accepted
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from() == {"type": "pong"}
    await communicator.send_to(text_data="{not json")
    assert (await communicator.receive_json_from())["error"] == "Messages must be JSON text."
    await communicator.send_json_to({"type": "subscribe", "to": "everything"})
    assert (await communicator.receive_json_from())["type"] == "error"
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from() == {"type": "pong"}
    await communicator.disconnect()


async def test_a_push_reaches_its_user_and_nobody_else(alice: User, bob: User) -> None:
    alice_socket, _, _ = await open_socket("/ws/notifications/", alice)
    bob_socket, _, _ = await open_socket("/ws/notifications/", bob)
    await sync_to_async(push.notify_user)(alice.pk, {"type": "notice", "text": "for alice"})
    assert await alice_socket.receive_json_from(timeout=5) == {"type": "notice", "text": "for alice"}
    assert await bob_socket.receive_nothing(timeout=0.5)
    await alice_socket.disconnect()
    await bob_socket.disconnect()


async def test_a_push_crosses_processes_to_a_real_daphne(portal_server: str, alice: User, bob: User) -> None:
    """Pushed in this process, carried by Redis, forwarded by the daphne process."""
    url = portal_server.replace("http://", "ws://") + "/ws/notifications/"
    origin = portal_server
    alice_cookie = await database_sync_to_async(session_cookie)(alice)
    bob_cookie = await database_sync_to_async(session_cookie)(bob)
    async with (
        websockets.connect(url, origin=origin, additional_headers={"Cookie": alice_cookie}) as alice_ws,  # type: ignore[arg-type]
        websockets.connect(url, origin=origin, additional_headers={"Cookie": bob_cookie}) as bob_ws,  # type: ignore[arg-type]
    ):
        await alice_ws.send(json.dumps({"type": "ping"}))
        assert json.loads(await asyncio.wait_for(alice_ws.recv(), 5)) == {"type": "pong"}
        await bob_ws.send(json.dumps({"type": "ping"}))
        assert json.loads(await asyncio.wait_for(bob_ws.recv(), 5)) == {"type": "pong"}
        await sync_to_async(push.notify_user)(alice.pk, {"type": "notice", "text": "across processes"})
        assert json.loads(await asyncio.wait_for(alice_ws.recv(), 5))["text"] == "across processes"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(bob_ws.recv(), 0.5)


async def test_daphne_refuses_a_websocket_without_a_session(portal_server: str) -> None:
    url = portal_server.replace("http://", "ws://") + "/ws/notifications/"
    async with websockets.connect(url, origin=portal_server) as ws:  # type: ignore[arg-type]
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CLOSE_UNAUTHENTICATED
