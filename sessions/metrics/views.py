"""Pages with live GPU charts: a session's page (its owner, or staff) and the live fleet (staff)."""

from __future__ import annotations

import time

import redis
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal.access import staff_required
from portal.http import PortalRequest
from sessions.metrics.agent import latest_frames
from sessions.metrics.frames import marked_if_stale


@staff_required
@require_GET
def fleet_live(request: PortalRequest) -> HttpResponse:
    """Every GPU and MIG device as a live tile: utilisation, memory, temperature, power, who uses it."""
    return render(request, "sessions/fleet_live.html")


@staff_required
@require_GET
def fleet_latest(request: PortalRequest) -> HttpResponse:
    """The newest fleet frame of every agent as JSON, for scripts and pages that cannot hold a websocket."""
    try:
        now = time.time()
        frames = [marked_if_stale(text, now) for text in latest_frames().values()]
    except redis.RedisError:
        return HttpResponse(
            '{"error": "live figures are unavailable right now"}', status=503, content_type="application/json"
        )
    # The frames are JSON already: join them instead of parsing and serialising again. A quiet agent's last
    # frame says it is stale, with its age.
    return HttpResponse('{"frames": [' + ",".join(frames) + "]}", content_type="application/json")
