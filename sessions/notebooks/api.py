"""The portal's internal API for the hub's spawner: launch specs in, lifecycle events back.

Only the hub may call it (the shared service token), and it speaks for one
person at a time (``sessions.access``): a spec is only handed out for a
session that is starting for exactly that hub user and server, so a launch
begun anywhere but the portal's form finds nothing here, and an event names
the user whose session it reports.
"""

from __future__ import annotations

import hmac
import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from sessions.notebooks import access as notebook_access
from sessions.notebooks import services
from sessions.notebooks.models import NotebookSession, WorkVolume
from sessions.runtime import engines
from sessions.runtime.slices import spec_for
from sessions.runtime.times import engine_time

log = logging.getLogger(__name__)
EVENTS = {"progress", "container_started", "ready", "stopped", "failed"}
# An engine whose clock runs minutes ahead of the portal's still reports real moments: refusing them would lose
# the start and leave the session unbilled (the meter charges nothing before a moment its clock reaches). A day
# ahead is no engine's clock.
CLOCK_SLACK = timedelta(days=1)


def _from_hub(request: HttpRequest) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # As bytes: compare_digest refuses non-ASCII text, and a header may carry anything.
    offered, expected = given.strip().encode(errors="replace"), settings.HUB_SERVICE_TOKEN.encode()
    return scheme == "Bearer" and bool(offered) and hmac.compare_digest(offered, expected)


def _refuse(status: int, error: str) -> JsonResponse:
    return JsonResponse({"error": error}, status=status)


@require_GET
def launch_spec(request: HttpRequest) -> HttpResponse:
    if not _from_hub(request):
        return _refuse(403, "This API is for JupyterHub only.")
    user, server = request.GET.get("user", ""), request.GET.get("server", "")
    session = services.launch_spec_for(user, server)
    if session is None or session.slice is None:
        log.warning("launch refused: no starting session %r for %r", server, user)
        return _refuse(404, "No session is starting under this name; start sessions from the portal's form.")
    return JsonResponse(spec(session))


def spec(session: NotebookSession) -> dict[str, Any]:
    """The launch spec: the container's spec (the same the Docker adapter applies) and what JupyterLab needs."""
    taken = session.slice
    assert taken is not None
    labels = {"gpu-portal.session": str(session.pk)}
    container = spec_for(taken, session.image.image, network=settings.USER_NETWORK.name, labels=labels)
    host = taken.gpu.host
    if host.cpus:  # cut to the size its host's agent recorded: the spawner may run on another machine
        container = container.within_host(host.cpus, host.memory_mib * 2**20 if host.memory_mib else None)
    return {
        "session": session.pk,
        "container": container.to_json(),
        "sized_for_host": host.name if host.cpus else "",
        "host": host.name,  # its Swarm node's hostname, where the hub's spawner runs services
        # The allocator's decision, for a spawner that asks a cluster for it (sessions.runtime.kube.slices).
        "slice": {"kind": taken.kind, "profile": taken.profile, "gpu": taken.gpu.uuid, "device": taken.device_uuid},
        "engine": engines.endpoint_of(host.name),  # "": the hub's own engine
        "environment": {"GPU_PORTAL_SESSION": str(session.pk), "GPU_PORTAL_SLICE": taken.describe()},
        "volume": WorkVolume.for_owner(session.owner_id).name,
    }


@csrf_exempt  # machine-to-machine, authenticated by the bearer token instead
@require_POST
def event(request: HttpRequest) -> HttpResponse:
    if not _from_hub(request):
        return _refuse(403, "This API is for JupyterHub only.")
    try:
        body = json.loads(request.body)
        session_id, kind, user = int(body["session"]), str(body["event"]), str(body["user"])
    except (ValueError, KeyError, TypeError):
        return _refuse(400, "Send JSON with 'session' (a number), 'user' (the hub's user name) and 'event'.")
    if kind not in EVENTS:
        return _refuse(400, f"Unknown event {kind!r}; one of {', '.join(sorted(EVENTS))}.")
    try:
        at = _moment(body.get("at"))
    except ValueError as error:
        return _refuse(400, str(error))
    # The hub speaks for the person whose server it runs, and only for their sessions.
    if not notebook_access.sessions_for_hub_user(user).filter(pk=session_id).exists():
        return _refuse(404, "No such session.")
    container_id, message = str(body.get("container_id", "")), str(body.get("message", ""))
    exit_code = body.get("exit_code")
    if exit_code is not None and (not isinstance(exit_code, int) or isinstance(exit_code, bool)):
        return _refuse(400, "'exit_code' must be a whole number.")
    end = services.ContainerEnd(at=at, exit_code=exit_code, oom_killed=body.get("oom_killed") is True)
    reason = str(body.get("reason", ""))[:500]  # what the owner reads of a failure, where the spawner says
    session = services.record_event(session_id, kind, container_id, message, at=at, end=end, reason=reason)
    return JsonResponse({"session": session.pk, "state": session.state})


def _moment(given: object) -> datetime | None:
    """The engine's time of a container moment (RFC 3339, as Docker writes it); never a day ahead."""
    if given in (None, ""):
        return None
    try:
        moment = engine_time(str(given))
    except ValueError:
        moment = None
    if moment is None or moment > timezone.now() + CLOCK_SLACK:
        raise ValueError(f"'at' must be a past moment in RFC 3339, as Docker reports it (got {str(given)[:40]!r}).")
    return moment
