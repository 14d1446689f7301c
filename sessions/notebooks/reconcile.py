"""Repairing drift between the portal's sessions, the hub's servers and Docker's containers.

The portal's rows are the truth about money and slices, Docker's containers
the truth about what runs. A session whose container died or was removed by
hand ends (its slice freed, the moment recorded); a container or slice that
belongs to no running session is cleaned up. Safe to run at any time, often.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.utils import timezone

from sessions.gpus.allocator import ReleaseRefused, release
from sessions.gpus.backends import BackendError
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookSession
from sessions.notebooks.services import end_session
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.isolation import repair

log = logging.getLogger(__name__)
START_TIMEOUT = timedelta(minutes=5)
State = NotebookSession.State


def reconcile(runtime: DockerRuntime | None = None) -> dict[str, int]:
    runtime = runtime or DockerRuntime()
    counts = {"ended": 0, "failed": 0, "containers_removed": 0, "slices_released": 0}
    # First, since a container must never run unfenced: a Docker restart or an operator may flush rules.
    counts["firewall_repaired"] = int(repair(runtime=runtime))
    for session in NotebookSession.objects.filter(state__in=[State.STARTING, State.RUNNING, State.STOPPING]):
        try:
            outcome = _check(session, runtime)
        except BackendError as error:  # its slice could not be freed: try again next time, go on with the rest
            log.error("session %s: could not end it: %s", session.pk, error)
            outcome = "errors"
        counts[outcome] = counts.get(outcome, 0) + 1
    for container_id, session_id in runtime.session_containers().items():
        if not NotebookSession.objects.filter(pk=session_id, state__in=NotebookSession.ACTIVE).exists():
            log.warning("removing container %s of ended session %s", container_id[:12], session_id)
            runtime.remove(container_id)
            counts["containers_removed"] += 1
    counts["slices_released"] = _release_orphan_slices()
    return counts


def _check(session: NotebookSession, runtime: DockerRuntime) -> str:
    found = runtime.container_state(session.pk)
    if session.state == State.STARTING:
        if found is None and timezone.now() - session.requested_at > START_TIMEOUT:
            end_session(session.pk, NotebookSession.EndReason.FAILURE, failed=True, message="It never started.")
            return "failed"
        return "ok"
    if found is not None and found.running:
        return "ok"
    gone_at = found.finished_at if found is not None else None
    end_session(session.pk, NotebookSession.EndReason.RECONCILIATION, gone_at=gone_at)
    return "ended"


def _release_orphan_slices() -> int:
    released = 0
    for taken in Slice.objects.filter(released_at__isnull=True, holder__startswith="notebook:"):
        session_id = int(taken.holder.split(":", 1)[1])
        if not NotebookSession.objects.filter(pk=session_id, state__in=NotebookSession.ACTIVE).exists():
            try:
                release(taken.pk, reason="its session had ended")
            except (BackendError, ReleaseRefused) as error:  # one slice that cannot be freed must not stop the rest
                log.error("slice %s: could not release it: %s", taken.pk, error)
                continue
            released += 1
    return released
