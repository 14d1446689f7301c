"""Stopping sessions nobody uses, after a warning, and sessions past the maximum age.

Idle means no activity the hub has seen (kernels, terminals, the browser)
for longer than the session's timeout: per MIG profile or kind where set,
else the default, so expensive slices can be freed sooner. A minute in
which the session's GPU was busy (utilisation at or over
PORTAL_IDLE_GPU_UTIL_PERCENT in the per-minute history) counts as activity
too: a training run with no browser open is not idle.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from portal import push
from sessions.gpus import workloads
from sessions.gpus.holders import Holder
from sessions.metrics.history import last_busy_minutes
from sessions.notebooks.hub import Hub, HubError
from sessions.notebooks.models import NotebookSession

log = logging.getLogger(__name__)


def idle_timeout(session: NotebookSession) -> timedelta:
    taken = session.slice
    keys = [taken.profile, taken.kind] if taken else []
    minutes = next((settings.IDLE_TIMEOUTS[k] for k in keys if k in settings.IDLE_TIMEOUTS), None)
    return timedelta(minutes=minutes or settings.IDLE_TIMEOUT_MINUTES)


def cull(activity: Mapping[int, datetime | None], now: datetime | None = None) -> dict[str, int]:
    """Warn or stop each running session, given the last activity the hub saw for it."""
    now = now or timezone.now()
    counts = {"warned": 0, "stopped": 0}
    running = list(NotebookSession.objects.filter(state=NotebookSession.State.RUNNING).select_related("slice", "owner"))
    gpu_busy = last_busy_minutes([s.pk for s in running], settings.IDLE_GPU_UTIL_PERCENT)
    for session in running:
        moments = (activity.get(session.pk), gpu_busy.get(session.pk), session.last_activity, session.ready_at)
        seen = [moment for moment in moments if moment]
        last = max(seen, default=session.requested_at)
        if session.last_activity != last:
            session.last_activity = last
            session.save(update_fields=["last_activity"])
        outcome = _judge(session, last, now)
        if outcome:
            counts[outcome] += 1
    return counts


def _judge(session: NotebookSession, last: datetime, now: datetime) -> str | None:
    warning = timedelta(minutes=settings.IDLE_WARNING_MINUTES)
    age_limit = (session.ready_at or session.requested_at) + timedelta(hours=settings.MAX_SESSION_HOURS)
    idle_limit = last + idle_timeout(session)
    if now >= age_limit:
        workloads.stop(Holder.notebook(session.pk), workloads.Reason.MAX_AGE)
        return "stopped"
    if not session.idle_exempt and now >= idle_limit:
        workloads.stop(Holder.notebook(session.pk), workloads.Reason.IDLE)
        return "stopped"
    deadlines = [(age_limit, "it reaches the maximum age")]
    if not session.idle_exempt:
        deadlines.append((idle_limit, "it is idle"))
    deadline, why = min(deadlines)
    if now >= deadline - warning and not session.warned_at:
        text = f"{session.server_name} will be stopped at {deadline:%H:%M} UTC because {why}."
        _warn(session, now, f"{text} Use it, or stop it yourself.")
        return "warned"
    return None


def _warn(session: NotebookSession, now: datetime, text: str) -> None:
    session.warned_at, session.warning = now, text[:200]
    session.save(update_fields=["warned_at", "warning"])
    push.notify_user(session.owner_id, {"type": "session.warning", "session": session.pk, "text": text})


def cull_running(now: datetime | None = None) -> dict[str, int]:
    """One round of culling (the beat's, every minute): what the hub saw of each running session, then cull()."""
    running = NotebookSession.objects.filter(state=NotebookSession.State.RUNNING).select_related("owner")
    return cull(hub_activity(list(running)), now=now)


def hub_activity(sessions: list[NotebookSession]) -> dict[int, datetime | None]:
    """Each session's last activity as the hub reports it (one call per person)."""
    hub, found = Hub(), {}
    for username in {session.owner.get_username() for session in sessions}:
        try:
            servers = hub.servers(username)
        except HubError as error:
            log.warning("idle check: %s", error)
            continue
        for session in (s for s in sessions if s.owner.get_username() == username):
            status = servers.get(session.server_name)
            found[session.pk] = parse_datetime(status.last_activity) if status and status.last_activity else None
    return found
