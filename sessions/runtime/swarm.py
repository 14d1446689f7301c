"""What the Swarm says of each GPU host's machine (issue 32): its node's id, state and availability, read from a
manager (``PORTAL_SWARM_MANAGER``) every few seconds by beat and shown on the fleet pages beside the agent's
heartbeat. A host's node is the one whose hostname is the host's name (the hub's Swarm spawner pins a host's
notebooks to it). The Swarm's word never changes where the allocator places: the agent's heartbeat does; a
host whose node is down or drained has its launches refused by the spawner, with that reason."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone
from docker.errors import DockerException

from sessions.gpus.models import GpuHost
from sessions.runtime import engines
from sessions.runtime.docker import RuntimeError_

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SwarmNode:
    hostname: str
    node_id: str
    state: str
    availability: str


def nodes(manager: str) -> list[SwarmNode]:
    """The Swarm's nodes as ``manager`` sees them; RuntimeError_ if it does not answer or is no manager."""
    try:
        listed = engines.at(manager).client.nodes.list()
    except DockerException as error:
        raise RuntimeError_(f"the Swarm manager {manager or 'on this machine'} did not answer: {error}") from None
    return [
        SwarmNode(
            hostname=str(node.attrs["Description"]["Hostname"]),
            node_id=str(node.id),
            state=str(node.attrs["Status"]["State"]),
            availability=str(node.attrs["Spec"].get("Availability", "")),
        )
        for node in listed
    ]


def record(found: list[SwarmNode]) -> int:
    """Each host's node as found (a host whose machine is not in the Swarm: none); how many hosts changed."""
    by_name = {node.hostname: node for node in found}
    recorded = GpuHost.objects.values_list("pk", "name", "swarm_node", "swarm_state", "swarm_availability")
    changed = 0
    for pk, name, *was in recorded:  # a write only where the Swarm's word changed
        node = by_name.get(name)
        seen = [node.node_id, node.state, node.availability] if node else ["", "", ""]
        if seen != was:
            changed += 1
            GpuHost.objects.filter(pk=pk).update(swarm_node=seen[0], swarm_state=seen[1], swarm_availability=seen[2])
    GpuHost.objects.update(swarm_seen_at=timezone.now())
    return changed


def watch() -> int:
    """Read the Swarm once (nothing without ``PORTAL_SWARM_MANAGER``); a manager that does not answer changes
    nothing (the last word stands, with its time)."""
    if not settings.SWARM_MANAGER:
        return 0
    try:
        found = nodes(settings.SWARM_MANAGER)
    except RuntimeError_ as error:
        log.warning("%s", error)
        return 0
    return record(found)
