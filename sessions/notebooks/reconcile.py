"""Repairing drift between the portal's sessions, the hub's servers and Docker's containers.

The portal's rows are the truth about money and slices, Docker's containers
the truth about what runs. A session whose container died or was removed by
hand ends (its slice freed, the moment recorded); a container or slice that
belongs to no running session is cleaned up. Safe to run at any time, often.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from sessions.gpus.allocator import ReleaseRefused, release
from sessions.gpus.backends import BackendError
from sessions.gpus.holders import HolderKind
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookSession
from sessions.notebooks.services import ContainerEnd, container_ended, fail
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.isolation import repair

log = logging.getLogger(__name__)
# A start may wait this long for the hub (PORTAL_HUB_START_PATIENCE_SECONDS); past it plus a margin, it never will.
START_MARGIN = timedelta(minutes=2)
NEVER_STARTED = (
    "The session never started: its container did not appear. Try again; if it keeps happening, tell an operator."
)
State = NotebookSession.State


def reconcile(runtime: DockerRuntime | None = None) -> dict[str, int]:
    runtime = runtime or DockerRuntime()
    counts = {"ended": 0, "failed": 0, "containers_removed": 0, "slices_released": 0}
    # First, since a container must never run unfenced: a Docker restart or an operator may flush rules.
    counts["firewall_repaired"] = int(repair(runtime=runtime))
    active = NotebookSession.objects.filter(state__in=[State.STARTING, State.RUNNING, State.STOPPING])
    for session in active.select_related("slice"):
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
        limit = timedelta(seconds=settings.HUB_START_PATIENCE_SECONDS) + START_MARGIN
        if found is None and timezone.now() - session.start_clock > limit:
            fail(session.pk, NEVER_STARTED, detail=f"no container after {limit}", forget=True)
            return "failed"
        return "ok"
    if found is not None and found.running:
        return "ok"
    end = ContainerEnd() if found is None else ContainerEnd(found.finished_at, found.exit_code, found.oom_killed)
    container_ended(session.pk, end)
    return "ended"


def _release_orphan_slices() -> int:
    released = 0
    active = NotebookSession.objects.filter(state__in=NotebookSession.ACTIVE).values("pk")
    held = Slice.objects.filter(released_at__isnull=True, holder_kind=HolderKind.NOTEBOOK)
    for slice_id in held.exclude(holder_id__in=active).values_list("pk", flat=True):
        try:
            release(slice_id, reason="its session had ended")
        except (BackendError, ReleaseRefused) as error:  # one slice that cannot be freed must not stop the rest
            log.error("slice %s: could not release it: %s", slice_id, error)
            continue
        released += 1
    return released
