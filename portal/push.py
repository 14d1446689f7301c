"""The one module that pushes to websocket groups.

Callers hand over plain data; the consumer forwards it unchanged.
"""

from __future__ import annotations

import asyncio
import threading
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
    message = {"type": "notify", "payload": payload}

    def send() -> None:
        async_to_sync(layer.group_send)(user_group(user_id), message)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        send()
        return
    # Called from a thread that runs an event loop: async_to_sync cannot run here, a helper thread can.
    helper = threading.Thread(target=send)
    helper.start()
    helper.join()
