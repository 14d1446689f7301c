"""Websockets that forward live GPU frames to those allowed to see them.

- ``/ws/metrics/fleet/``: every GPU and MIG device; staff only.
- ``/ws/metrics/mine/``: the person's own slices.
- ``/ws/metrics/sessions/<id>/``: the frames of that session's owner (the owner or staff).

Frames arrive serialised (the agent does it once) and go out as text. A frame
older than a few ticks is dropped rather than sent late: a slow client never
queues without bound, and never slows the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import Counter
from typing import Any, ClassVar

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from portal import push
from portal.roles import is_operator
from sessions.metrics.agent import latest_key
from sessions.metrics.frames import STALE_AFTER_S, marked_if_stale, sampled_at

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_MANY = 4429


class MetricsConsumer(AsyncWebsocketConsumer):
    channel_layer_alias = push.METRICS_LAYER
    open_per_user: ClassVar[Counter[int]] = Counter()  # this process's open metric sockets per person

    group_name: str | None = None
    counted_user: int | None = None
    dropped = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent_up_to: dict[str, float] = {}  # per agent, the sample time of the newest frame sent

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()  # accept first, so a refusal reaches the browser as our close code
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if self.open_per_user[user.pk] >= settings.METRICS_SOCKETS_PER_USER:
            log.warning("metrics socket refused: %s already has %s open", user, self.open_per_user[user.pk])
            await self.close(code=CLOSE_TOO_MANY)
            return
        group = await self._group_for(user)
        if group is None:
            log.warning("metrics socket refused: %s may not watch %s", user, self.scope["path"])
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.open_per_user[user.pk] += 1
        self.counted_user = user.pk
        self.group_name = group
        await self.channel_layer.group_add(group, self.channel_name)
        if group == push.fleet_metrics_group():
            await self._send_latest()

    async def _group_for(self, user: Any) -> str | None:
        kwargs = self.scope["url_route"]["kwargs"]
        if "session_id" in kwargs:
            owner = await _watchable_session_owner(user, kwargs["session_id"])
            if owner is None:
                return None
            return push.user_metrics_group(owner)
        if kwargs.get("stream") == "fleet":
            return push.fleet_metrics_group() if is_operator(user) else None
        return push.user_metrics_group(user.pk)

    async def _send_latest(self) -> None:
        """The newest fleet frames at once, so a page has tiles before the next tick."""
        try:
            latest = await _latest_client().hgetall(latest_key())
        except Exception as error:  # Redis away: the next tick brings a frame anyway
            log.info("metrics socket: no latest frame to send: %s", error)
            return
        for agent, raw in latest.items():
            text = raw if isinstance(raw, str) else raw.decode()
            t = sampled_at(text)
            if t is not None:  # the same frame may also come through the group we just joined: send it once
                self.sent_up_to[agent if isinstance(agent, str) else agent.decode()] = t
            await self.send(text_data=marked_if_stale(text, time.time()))

    async def disconnect(self, code: int) -> None:
        if self.group_name:
            await self.channel_layer.group_discard(self.group_name, self.channel_name)
        if self.counted_user is not None:
            self.open_per_user[self.counted_user] -= 1
            if self.open_per_user[self.counted_user] <= 0:
                del self.open_per_user[self.counted_user]
            self.counted_user = None

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Frames skip channels' per-message hop to a thread that closes old DB connections:
        # forwarding touches no database, and at 1 Hz x hundreds of sockets the hop is the cost.
        if message["type"] == push.METRICS_FRAME:
            await self.metrics_frame(message)
            return
        await super().dispatch(message)

    async def metrics_frame(self, event: dict[str, Any]) -> None:
        t, agent = float(event["t"]), str(event.get("agent", ""))
        if time.time() - t > STALE_AFTER_S:
            self.dropped += 1
            return
        if t <= self.sent_up_to.get(agent, 0.0):  # sent already, on connecting: never twice, never backwards
            return
        self.sent_up_to[agent] = t
        await self.send(text_data=event["text"])

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            content = json.loads(text_data) if text_data is not None else None
        except ValueError:
            content = None
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send(text_data=json.dumps({"type": "pong", "dropped": self.dropped}))
            return
        error = 'This socket only sends frames; it answers {"type": "ping"} and nothing else.'
        await self.send(text_data=json.dumps({"type": "error", "error": error}))


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = weakref.WeakKeyDictionary()


def _latest_client() -> aioredis.Redis:
    """One Redis client per event loop for the latest frames: a storm of connecting sockets shares its pool."""
    loop = asyncio.get_running_loop()
    if loop not in _clients:
        _clients[loop] = aioredis.from_url(settings.REDIS_URL, socket_timeout=1, max_connections=50)
    return _clients[loop]


@database_sync_to_async
def _watchable_session_owner(user: Any, session_id: int) -> int | None:
    """The owner of a session this person may watch; None for one that is not theirs or does not exist. Asked
    through the workload registry: metrics read no workload's models."""
    from sessions import access
    from sessions.gpus import workloads
    from sessions.gpus.holders import Holder

    owner = workloads.kind_of(Holder.notebook(session_id)).owner_of(session_id)
    return owner if access.reaches(user, access.Action.VIEW, owner) else None
