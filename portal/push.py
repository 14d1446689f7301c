"""The one module that pushes to websocket groups.

Callers hand over plain data; the consumer forwards it unchanged.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def notify_user(user_id: int, payload: dict[str, Any]) -> None:
    """Send a notice to every open tab of one user (from sync code: views, tasks)."""
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(user_group(user_id), {"type": "notify", "payload": payload})
