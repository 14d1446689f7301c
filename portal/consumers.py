"""Websocket consumers of the portal itself: they authenticate, join groups and forward."""

from __future__ import annotations

import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from portal import push

log = logging.getLogger(__name__)

# Close codes in the 4000 range are ours; browsers see them in the close event.
CLOSE_UNAUTHENTICATED = 4401


class ForwardingConsumer(AsyncJsonWebsocketConsumer):
    """What every socket that only forwards a group's pushes shares: leaving its group, answering pings,
    and a clear error for any other message. Subclasses authenticate and pick ``group_name`` in connect."""

    group_name: str | None = None

    async def disconnect(self, code: int) -> None:
        if self.group_name:
            await self.channel_layer.group_discard(self.group_name, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})
            return
        await self.send_json({"type": "error", "error": 'Unknown message; this socket only answers {"type": "ping"}.'})

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        try:
            await super().receive(text_data=text_data, bytes_data=bytes_data, **kwargs)
        except ValueError:
            await self.send_json({"type": "error", "error": "Messages must be JSON text."})


class NotificationConsumer(ForwardingConsumer):
    """Per-user notices (session state changes, billing alerts) pushed by portal.push."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            log.info("websocket refused: no logged-in session")
            # Accept, then close with our code: a browser sees 4401 ("log in again")
            # instead of an anonymous handshake failure.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.group_name = push.notice_group(user.pk)
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        await self.accept()

    async def notify(self, event: dict[str, Any]) -> None:
        await self.send_json(event["payload"])
