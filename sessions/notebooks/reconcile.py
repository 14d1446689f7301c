"""Repairing drift between the portal's sessions, the hub's servers and Docker's containers.

The portal's rows are the truth about money and slices, Docker's containers
the truth about what runs. Each container seen running is a proof of life of
its session's holding (the database's moment read before the look), which is
what the meter charges up to: while the engine cannot be reached, nothing is
proven and nothing more is charged, until a later look confirms the container
again. A start the spawner's report never brought is recorded from the
engine's own StartedAt. A session whose container died or was removed by
hand ends (its slice freed, the moment recorded); a container or slice that
belongs to no running session is cleaned up. A start whose task was lost (a
broker that did not answer) is sent again, and a stop the hub did not take is
asked again. Safe to run at any time, often.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import ReleaseRefused, release
from sessions.gpus.holders import HolderKind
from sessions.gpus.models import GpuHost, Slice
from sessions.notebooks.hub import Hub, HubError
from sessions.notebooks.models import NotebookSession
from sessions.notebooks.services import (
    ContainerEnd,
    ask_hub_to_stop,
    container_ended,
    fail,
    record_event,
    send_start_again,
)
from sessions.runtime import engines
from sessions.runtime.docker import ContainerState, DockerRuntime, RuntimeError_
from sessions.runtime.engine_config import KUBE
from sessions.runtime.isolation import repair

if TYPE_CHECKING:  # the cluster's client is loaded only where a kube:// host needs it
    from sessions.runtime.kube.pods import PodRuntime

log = logging.getLogger(__name__)
# A start may wait this long for the hub (PORTAL_HUB_START_PATIENCE_SECONDS); past it plus a margin, it never will.
START_MARGIN = timedelta(minutes=2)
# A start's task is sent as its session commits: one not noted as sent this long after the session got its
# slice never reached the broker.
START_SEND_GRACE = timedelta(seconds=20)
# The task notes each run (every 30 s at most while the hub is silent); once the hub took the start, its
# container appears within seconds. One not heard of this long, with no container, was lost.
START_SILENCE = timedelta(minutes=2)
# The hub stops a server within seconds of taking the request: a container still running this long after was
# forgotten (the hub restarted mid-stop, say).
STOP_SILENCE = timedelta(minutes=2)
NEVER_STARTED = (
    "The session never started: its container did not appear. Try again; if it keeps happening, tell an operator."
)
State = NotebookSession.State


def reconcile(runtime: DockerRuntime | None = None) -> dict[str, int]:
    """Follow every engine's sessions and containers (``runtime``: one engine for every host), each engine on
    its own (``sessions.runtime.engines``): one that does not answer confirms nothing of its hosts' sessions, so
    nothing more is charged there, and stops nothing on the others."""
    counts = {"ended": 0, "failed": 0, "starts_sent": 0, "stops_sent": 0, "containers_removed": 0, "slices_released": 0}
    proof = database_now()  # before the look: a container seen running after it ran at this moment
    counts["confirmed"] = 0
    names = GpuHost.objects.values_list("name", flat=True)
    for endpoint, hosts in engines.by_engine(names).items():
        try:
            here = runtime or (_pods(endpoint) if endpoint.startswith(KUBE) else engines.at(endpoint))
            counts["confirmed"] += _follow(here, proof, counts, hosts, local=endpoint == engines.LOCAL)
        except (RuntimeError_, OSError) as error:  # the engine does not answer: nothing there is confirmed
            log.error(
                "the Docker engine of %s cannot be reached; none of their sessions is confirmed running: %s",
                ", ".join(hosts) or "this machine",
                error,
            )
            counts["engine_unreachable"] = counts.get("engine_unreachable", 0) + 1
        if runtime is not None:
            break  # one engine given for every host: followed once
    counts["slices_released"] = _release_orphan_slices()
    return counts


def _follow(
    runtime: DockerRuntime | PodRuntime, proof: datetime, counts: dict[str, int], hosts: list[str], local: bool = True
) -> int:
    """Check every active session on ``hosts`` (``local``: and those with no slice) against its container, and
    every container of this engine against its session; returns how many holdings were confirmed running (their
    proof of life moved to ``proof``)."""
    # First, since a container must never run unfenced: a Docker restart or an operator may flush rules.
    if local and isinstance(runtime, DockerRuntime):
        counts["firewall_repaired"] = int(repair(runtime=runtime))
    on_hosts = Q(slice__gpu__host__name__in=hosts) | (Q(slice__isnull=True) if local else Q(pk__in=[]))
    active = NotebookSession.objects.filter(on_hosts, state__in=[State.STARTING, State.RUNNING, State.STOPPING])
    running: list[int] = []
    containers = runtime.session_containers()  # first: an engine that does not answer is found before any change
    for session in active.select_related("slice", "owner"):
        outcome = _check(session, runtime, running)
        counts[outcome] = counts.get(outcome, 0) + 1
    for container_id, session_id in containers.items():
        if not NotebookSession.objects.filter(pk=session_id, state__in=NotebookSession.ACTIVE).exists():
            log.warning("removing container %s of ended session %s", container_id[:12], session_id)
            runtime.remove(container_id)
            counts["containers_removed"] += 1
    return holdings.seen(running, at=proof)


def _check(session: NotebookSession, runtime: DockerRuntime | PodRuntime, running: list[int] | None = None) -> str:
    """Compare one session with its container; ``running`` gathers the slices of those seen running."""
    found = runtime.container_state(session.pk)
    if found is not None and session.container_started_at is None and found.started_at is not None:
        _started_unreported(session, found)
    if found is not None and found.running and session.slice_id and running is not None:
        running.append(session.slice_id)
    if session.state == State.STARTING:
        return "ok" if found is not None else _check_start(session)
    if found is not None and found.running:
        return _check_stop(session) if session.state == State.STOPPING else "ok"
    end = ContainerEnd() if found is None else ContainerEnd(found.finished_at, found.exit_code, found.oom_killed)
    container_ended(session.pk, end)
    return "ended"


def _started_unreported(session: NotebookSession, found: ContainerState) -> None:
    """The spawner's report of the start never reached the portal (sent once, lost): the engine's StartedAt is
    recorded instead, so the session is charged from its container's start like any other."""
    log.warning("session %s: its container's start was never reported; recorded from the engine", session.pk)
    record_event(session.pk, "container_started", at=found.started_at)
    session.refresh_from_db()


def _check_start(session: NotebookSession) -> str:
    """A starting session with no container: failed once the hub's patience is past; its start sent again when
    its task was lost and the hub has no server of that name (a second start of one server starts one)."""
    now = timezone.now()
    limit = timedelta(seconds=settings.HUB_START_PATIENCE_SECONDS) + START_MARGIN
    if now - session.start_clock > limit:
        fail(session.pk, NEVER_STARTED, detail=f"no container after {limit}", forget=True)
        return "failed"
    if not _start_lost(session, now) or _at_hub(session):
        return "ok"
    try:
        send_start_again(session.pk)
    except BrokerError as error:  # still not answering: the next round tries again
        log.error("session %s: could not send its start again: %s", session.pk, error)
        return "errors"
    return "starts_sent"


def _start_lost(session: NotebookSession, now: datetime) -> bool:
    """Its start never reached the broker, or has not been heard of for long."""
    if session.start_sent_at is None:
        return now - session.start_clock > START_SEND_GRACE
    return now - session.start_sent_at > START_SILENCE


def _at_hub(session: NotebookSession) -> bool:
    """The hub has a server of the session's name: its start is under way (or an earlier one of that name
    still stops). A hub that does not answer cannot say: the start is sent, and its task waits for the hub."""
    try:
        return session.server_name in Hub().servers(session.owner.get_username())
    except HubError as error:
        log.warning("session %s: could not ask the hub for its server: %s", session.pk, error)
        return False


def _check_stop(session: NotebookSession) -> str:
    """A stopping session whose container still runs: the hub is asked again if it never took the stop (it
    did not answer) or took it long ago. Its charges run until the container is gone, and end at that moment."""
    taken = session.stop_sent_at
    if taken is not None and timezone.now() - taken < STOP_SILENCE:
        return "ok"
    return "stops_sent" if ask_hub_to_stop(session) else "errors"


def _release_orphan_slices() -> int:
    released = 0
    active = NotebookSession.objects.filter(state__in=NotebookSession.ACTIVE).values("pk")
    held = Slice.objects.filter(released_at__isnull=True, holder_kind=HolderKind.NOTEBOOK)
    for slice_id in held.exclude(holder_id__in=active).values_list("pk", flat=True):
        try:
            release(slice_id, reason="its session had ended")
        except ReleaseRefused as error:  # one slice that cannot be freed must not stop the rest
            log.error("slice %s: could not release it: %s", slice_id, error)
            continue
        released += 1
    return released


def _pods(endpoint: str) -> PodRuntime:
    from sessions.runtime.kube.pods import PodRuntime

    return PodRuntime(endpoint)
