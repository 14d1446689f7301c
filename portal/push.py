"""The one module that pushes to websocket groups, and the one place group names are made.

Two kinds of push: notices to one person's open tabs (the default channel layer),
and the GPU agent's metric frames (the ``metrics`` layer, Redis pub/sub: a frame
nobody listens to is dropped, never queued). Callers hand over plain data or
frames serialised once; the consumers forward them unchanged.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import BaseChannelLayer, get_channel_layer
from django.core.exceptions import ImproperlyConfigured

METRICS_LAYER = "metrics"
METRICS_FRAME = "metrics.frame"  # the consumers' handler for it: MetricsConsumer.metrics_frame


def notice_group(user_id: int) -> str:
    """One person's open tabs, for notices (session changes, warnings, billing alerts)."""
    return f"user.{user_id}"


def fleet_metrics_group() -> str:
    """Staff watching every GPU."""
    return "metrics.fleet"


def user_metrics_group(user_id: int) -> str:
    """Whoever watches one person's slices: the person, and staff on that person's session pages."""
    return f"metrics.user.{user_id}"


def notify_user(user_id: int, payload: dict[str, Any]) -> None:
    """Send a notice to every open tab of one user (from sync code: views, tasks)."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "notify", "payload": payload}

    def send() -> None:
        async_to_sync(layer.group_send)(notice_group(user_id), message)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        send()
        return
    # Called from a thread that runs an event loop: async_to_sync cannot run here, a helper thread can.
    helper = threading.Thread(target=send)
    helper.start()
    helper.join()


def metrics_layer() -> BaseChannelLayer:
    layer = get_channel_layer(METRICS_LAYER)
    if layer is None:
        raise ImproperlyConfigured(f"CHANNEL_LAYERS has no {METRICS_LAYER!r} layer for the GPU agent's frames")
    return layer


def _frame_message(text: str, t: float, agent: str) -> dict[str, Any]:
    # ``t`` (when it was sampled) lets the consumers drop stale frames and never send one twice
    # without parsing the text.
    return {"type": METRICS_FRAME, "text": text, "t": t, "agent": agent}


async def publish_frame(layer: BaseChannelLayer, group: str, text: str, t: float, agent: str) -> None:
    """One serialised frame to one group of metric sockets."""
    await layer.group_send(group, _frame_message(text, t, agent))


async def publish_frames(
    layer: BaseChannelLayer, fleet: str, personal: Mapping[int, str], t: float, agent: str
) -> None:
    """One tick of the agent: the fleet frame to staff, each person's frame to whoever watches them."""
    sends = [publish_frame(layer, fleet_metrics_group(), fleet, t, agent)]
    for owner, text in personal.items():
        sends.append(publish_frame(layer, user_metrics_group(owner), text, t, agent))
    await asyncio.gather(*sends)
