"""The one module that pushes to websocket groups, and the one place group names are made.

Three kinds of push: notices to one person's open tabs and render jobs' progress to the
pages that follow them (both on the default channel layer), and the GPU agent's metric
frames (the ``metrics`` layer, Redis pub/sub: a frame nobody listens to is dropped, never
queued). Callers hand over plain data or
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


def render_owner_group(owner_id: int) -> str:
    """The pages that follow every render job of one person (their jobs list)."""
    return f"render.user.{owner_id}"


def render_job_group(job_id: int) -> str:
    """The pages that follow one render job: its owner's, and staff's."""
    return f"render.job.{job_id}"


RENDER_PROGRESS = "render.progress"  # the consumers' handler for it: RenderProgressConsumer.render_progress


def notify_user(user_id: int, payload: dict[str, Any]) -> None:
    """Send a notice to every open tab of one user (from sync code: views, tasks)."""
    _send([notice_group(user_id)], {"type": "notify", "payload": payload})


def render_progress(owner_id: int, job_id: int, payload: dict[str, Any]) -> None:
    """A render job's progress (frames, samples, ETA, cost, thumbnail, log tail) to whoever follows it."""
    _send([render_owner_group(owner_id), render_job_group(job_id)], {"type": RENDER_PROGRESS, "payload": payload})


def _send(groups: list[str], message: dict[str, Any]) -> None:
    """One message to some groups of the default layer, from sync code (views, tasks, worker threads)."""
    layer = get_channel_layer()
    if layer is None:
        return

    def send() -> None:
        for group in groups:
            async_to_sync(layer.group_send)(group, message)

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
