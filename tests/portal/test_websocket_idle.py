"""An idle notifications socket stays open: the channel layer's blocking read must outlast Redis's read timeout."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from portal import push
from tests.helpers.websockets import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_S = 20  # past the layer's Redis read timeout (15 s) and several of its 5 s blocking reads


async def test_an_idle_notifications_socket_stays_open_and_still_receives_a_push(
    portal_server: str, alice: User
) -> None:
    url = portal_server.replace("http://", "ws://") + "/ws/notifications/"
    cookie = await database_sync_to_async(session_cookie)(alice)
    # No websocket pings from our side either: the socket is as quiet as a tab nobody looks at.
    async with websockets.connect(
        url,
        origin=portal_server,  # type: ignore[arg-type]
        additional_headers={"Cookie": cookie},
        ping_interval=None,
    ) as ws:
        await ws.send(json.dumps({"type": "ping"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5)) == {"type": "pong"}
        with pytest.raises(TimeoutError):
            # Anything arriving here is wrong: a message nobody sent, or the server closing (1011).
            message = await asyncio.wait_for(ws.recv(), IDLE_S)
            pytest.fail(f"the idle socket received {message!r}")
        await sync_to_async(push.notify_user)(alice.pk, {"type": "notice", "text": "after a quiet while"})
        assert json.loads(await asyncio.wait_for(ws.recv(), 5)) == {"type": "notice", "text": "after a quiet while"}
