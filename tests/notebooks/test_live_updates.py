"""A session's owner hears of each change over the websocket; nobody else does."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage
from sessions.notebooks.services import Launch, record_event, start_session
from tests.helpers.websockets import open_socket

pytestmark = pytest.mark.django_db(transaction=True)


async def test_the_owner_hears_each_state_change_and_others_hear_nothing(
    notebook_image: NotebookImage, alice: User, bob: User
) -> None:
    alice_socket, _, _ = await open_socket("/ws/notifications/", alice)
    bob_socket, _, _ = await open_socket("/ws/notifications/", bob)
    launch = Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "live")
    session = await database_sync_to_async(start_session)(alice, launch)
    assert await alice_socket.receive_json_from(timeout=5) == {
        "type": "session.changed",
        "session": session.pk,
        "state": "starting",
    }
    await database_sync_to_async(record_event)(session.pk, "ready")
    assert (await alice_socket.receive_json_from(timeout=5))["state"] == "running"
    assert await bob_socket.receive_nothing(timeout=0.5)
    await alice_socket.disconnect()
    await bob_socket.disconnect()
