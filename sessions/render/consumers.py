"""The websocket that forwards render jobs' progress (pushed by ``portal.push.render_progress``).

- ``/ws/render/``: every job of the person (their jobs list).
- ``/ws/render/<id>/``: one job, for its owner or staff (``sessions.access``); anyone else is refused.

It authenticates, joins one group and forwards; it never reads or changes a job beyond the access check.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from portal import push
from portal.consumers import ForwardingConsumer
from sessions import access
from sessions.render import access as render_access

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403  # also for a job that does not exist: nobody learns what others render


@database_sync_to_async
def _reaches(user: User, job_id: int) -> bool:
    try:
        render_access.render_job_for(user, job_id)
    except access.NotFound:
        return False
    return True


class RenderProgressConsumer(ForwardingConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()  # first, so a refusal reaches the browser as our close code
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        job_id = self.scope["url_route"]["kwargs"].get("job_id")
        if job_id is None:
            self.group_name = push.render_owner_group(user.pk)
        elif await _reaches(user, int(job_id)):
            self.group_name = push.render_job_group(int(job_id))
        else:
            log.info("render progress socket refused: %s may not follow job %s", user, job_id)
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(self.group_name, self.channel_name)

    async def render_progress(self, event: dict[str, Any]) -> None:
        await self.send_json(event["payload"])
