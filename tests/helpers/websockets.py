"""Open websockets against the real ASGI application, as a logged-in user or as nobody."""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from portal.asgi import application


def session_cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def open_socket(
    path: str,
    user: User | None = None,
    origin: str = "http://127.0.0.1:8000",
    early: list[dict[str, Any]] | None = None,
) -> tuple[WebsocketCommunicator, bool, int | None]:
    """Connect through the whole ASGI stack (origin check, session auth, routing).

    Returns the communicator, whether it stayed open, and the close code if not
    (a consumer may accept and close at once to send its own close code). A caller
    that follows live pushes passes `early`: what the consumer sends while the
    socket settles (a push that was already on its way) lands there, in order.
    """
    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", origin.encode())]
    if user is not None:
        cookie = await database_sync_to_async(session_cookie)(user)
        headers.append((b"cookie", cookie.encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    accepted, code = await communicator.connect(timeout=5)
    if not accepted:
        return communicator, False, code
    while not await communicator.receive_nothing(timeout=0.2):
        first = await communicator.receive_output()
        if first["type"] == "websocket.close":
            return communicator, False, first.get("code")
        if early is None or first["type"] != "websocket.send":
            raise AssertionError(f"unexpected first message from the consumer: {first}")
        early.append(json.loads(first["text"]))
    return communicator, True, None
