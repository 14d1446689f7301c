"""GPU hosts as the portal follows them: each host's agent beats for it, the watch finds the silent ones, and
an operator drains a host and brings it back.

- **up**: its agent beats (or none ever has: a host only discovery knows, as on a portal run without an
  agent); the allocator places on it.
- **draining**: an operator took it out of placement. What runs there runs on to its end; nothing new starts.
- **lost**: its agent has been silent for ``PORTAL_HOST_LOST_AFTER_S``. Nothing is placed there, and no proof
  of life from it is taken, so its holdings are not charged past its last heartbeat (the ones already seen
  past it are brought back to it). When the agent beats again the host is up (or draining, if an operator
  drained it) and the engine's word on each container settles its holding to the real end. A host silent for
  ``PORTAL_HOST_GIVE_UP_AFTER_S`` more is given up: each holding there ends at the last heartbeat, and its
  workload is told (a session stops, a render job goes on elsewhere) with a reason its owner reads.

A host beats with the identity of its machine. A second machine beating for a host another one beats for is
refused and the host flagged, until the first has gone silent.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, QuerySet
from django.db.models.functions import Greatest

from portal.clock import database_now
from sessions.gpus import workloads
from sessions.gpus.allocator import hold_every_pool
from sessions.gpus.holdings import ended
from sessions.gpus.models import GpuHost, Slice

log = logging.getLogger(__name__)
State = GpuHost.State
TWO_MACHINES = "Two machines beat for this host:"
MACHINE_ID = Path("/etc/machine-id")


class HostRefused(ValueError):
    """A heartbeat or an operator's change that breaks a rule; the message says which."""


@dataclass(frozen=True)
class Node:
    """The machine an agent runs on: who it is and how big."""

    node_id: str
    cpus: int | None
    memory_mib: int | None

    @classmethod
    def this_machine(cls) -> Node:
        return cls(node_identity(), os.cpu_count(), _memory_mib())


def node_identity() -> str:
    """PORTAL_GPU_NODE_ID, else the machine's id (systemd's /etc/machine-id), else its host name."""
    if settings.GPU_NODE_ID:
        return str(settings.GPU_NODE_ID)
    try:
        machine = MACHINE_ID.read_text().strip()
    except OSError:
        machine = ""
    return machine or socket.gethostname()


def _memory_mib() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        return None


def heartbeat(name: str, backend: str, node: Node) -> GpuHost:
    """The agent of ``node`` is alive and beats for host ``name``: recorded with the database's clock. A lost
    host is back. Raises HostRefused (the host flagged) while another machine's agent beats for it."""
    with transaction.atomic():
        now = database_now()
        host = GpuHost.objects.select_for_update().filter(name=name).first()
        if host is None:
            host = GpuHost(name=name, backend=backend, state_since=now)
        refusal = ""
        if host.node_id and host.node_id != node.node_id and not _silent(host, now):
            refusal = (
                f"{TWO_MACHINES} {host.node_id} (taken) and {node.node_id} (refused). "
                "Give one of them another PORTAL_GPU_HOST_NAME."
            )
            GpuHost.objects.filter(pk=host.pk).update(problem=refusal)  # committed: the flag is the point
        else:
            _beaten(host, node, now)
    if refusal:
        log.error("host %s: %s", name, refusal)
        raise HostRefused(refusal)
    return host


def _beaten(host: GpuHost, node: Node, now: datetime) -> None:
    if host.problem.startswith(TWO_MACHINES):
        host.problem = ""
    if host.state == State.LOST:
        away = now - host.heartbeat_at if host.heartbeat_at else timedelta(0)
        host.state = State.DRAINING if host.drained else State.UP
        host.state_reason, host.state_since = host.drained, now
        log.warning("host %s is back after %s without a heartbeat", host.name, away)
    host.node_id, host.heartbeat_at, host.cpus, host.memory_mib = node.node_id, now, node.cpus, node.memory_mib
    host.save()


def _silent(host: GpuHost, now: datetime) -> bool:
    return host.heartbeat_at is None or now - host.heartbeat_at > timedelta(seconds=settings.HOST_LOST_AFTER_S)


def watch() -> dict[str, list[str]]:
    """Find the hosts whose agent went silent (lost), and give up those silent for too long. Idempotent: run
    by beat every few seconds. Returns the names of the hosts lost and given up by this look."""
    now = database_now()
    lost, given_up = [], []
    silent_since = now - timedelta(seconds=settings.HOST_LOST_AFTER_S)
    for host_id in (
        GpuHost.objects.filter(heartbeat_at__lt=silent_since).exclude(state=State.LOST).values_list("pk", flat=True)
    ):
        if _lose(host_id, now):
            lost.append(GpuHost.objects.get(pk=host_id).name)
    too_long = silent_since - timedelta(seconds=settings.HOST_GIVE_UP_AFTER_S)
    for host in GpuHost.objects.filter(state=State.LOST, heartbeat_at__lt=too_long):
        if give_up(host):
            given_up.append(host.name)
    return {"lost": lost, "given_up": given_up}


def _lose(host_id: int, now: datetime) -> bool:
    with transaction.atomic():
        host = GpuHost.objects.select_for_update().get(pk=host_id)
        if host.state == State.LOST or not _silent(host, now) or host.heartbeat_at is None:
            return False  # it beat meanwhile
        last = host.heartbeat_at
        reason = f"No heartbeat from its agent since {last:%Y-%m-%d %H:%M:%S} UTC."
        GpuHost.objects.filter(pk=host_id).update(state=State.LOST, state_reason=reason, state_since=now)
        # Proofs of life past its last heartbeat are taken back: nothing there is charged past it.
        open_holdings(host_id).filter(seen_at__gt=last).update(seen_at=Greatest(last, F("held_from")))
    log.warning("host %s is lost: %s", host.name, reason)
    return True


def open_holdings(host_id: int) -> QuerySet[Slice]:
    return Slice.objects.filter(gpu__host_id=host_id, released_at__isnull=True)


def give_up(host: GpuHost) -> int:
    """Every holding on a host that never came back ends at its last heartbeat, and its workload is told (the
    reason its owner reads: the host stopped answering). Returns how many holdings it ended."""
    count = 0
    for taken in open_holdings(host.pk).filter(held_until__isnull=True).exclude(holder_kind=""):
        # The end first: the workload's own end path keeps the first end recorded, whatever its engine says.
        if taken.held_from is not None and host.heartbeat_at is not None:
            ended(taken.pk, taken.held_from, max(host.heartbeat_at, taken.held_from))
        holder = taken.holder
        if holder is None:
            continue
        try:
            workloads.kind_of(holder).give_up(holder.id, taken.pk, workloads.Reason.HOST_LOST)
        except Exception:  # one workload that cannot be told stops none of the others; the next look tries again
            log.exception("host %s: %s could not be told its host is gone", host.name, holder.label)
            continue
        count += 1
    if count:
        log.warning("host %s: gave up %d holding(s) at its last heartbeat %s", host.name, count, host.heartbeat_at)
    return count


def drain(host_id: int, by: User) -> GpuHost:
    """Take a host out of placement: nothing new is placed there from the moment this returns (allocations in
    flight finish first: it waits for every pool's turn), and what runs there runs on. A lost host drained
    stays out of placement when it is back."""
    with transaction.atomic():
        hold_every_pool()
        host = GpuHost.objects.select_for_update().get(pk=host_id)
        if host.drained:
            raise HostRefused(f"{host.name} is already drained ({host.drained})")
        now = database_now()
        host.drained = f"Drained by {by.get_username()} at {now:%Y-%m-%d %H:%M} UTC."
        if host.state != State.LOST:
            host.state, host.state_reason, host.state_since = State.DRAINING, host.drained, now
        host.save(update_fields=["drained", "state", "state_reason", "state_since"])
    log.info("host %s: %s", host.name, host.drained)
    return host


def resume(host_id: int, by: User) -> GpuHost:
    """Bring a drained host back into placement (a lost one stays lost until its agent beats again)."""
    with transaction.atomic():
        host = GpuHost.objects.select_for_update().get(pk=host_id)
        if not host.drained:
            raise HostRefused(f"{host.name} is not drained.")
        host.drained = ""
        if host.state != State.LOST:
            host.state, host.state_reason, host.state_since = State.UP, "", database_now()
        host.save(update_fields=["drained", "state", "state_reason", "state_since"])
    log.info("host %s back in placement, by %s", host.name, by.get_username())
    return host
