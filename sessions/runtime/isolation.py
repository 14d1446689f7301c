"""Putting the user-container network in place and taking it away: the bridge and its firewall together.

Run before the hub starts (it listens on the bridge's gateway) and checked
again by reconciliation, since a Docker restart or an operator may flush rules.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings

from sessions.runtime.docker import DockerRuntime
from sessions.runtime.firewall import Firewall
from sessions.runtime.network import UserNetwork, parse

log = logging.getLogger(__name__)


def isolate(network: UserNetwork | None = None, runtime: DockerRuntime | None = None) -> str:
    """Create the bridge and write its firewall; returns what was done, in words."""
    network = network or settings.USER_NETWORK
    if not network.isolated:
        return "user containers share the host's network (PORTAL_NOTEBOOK_NETWORK=host): unsafe, development only"
    (runtime or DockerRuntime()).ensure_network(network)
    Firewall(network).apply()
    reach = "the internet" if network.internet else "nothing outside"
    return (
        f"user containers: network {network.name} ({network.subnet}, bridge {network.bridge}); they reach the hub "
        f"at {network.hub_url} and {reach}; nothing else of this host"
    )


def repair(network: UserNetwork | None = None, runtime: DockerRuntime | None = None) -> bool:
    """Re-apply the firewall of an existing bridge if a hook has gone; returns whether it had to."""
    network = network or settings.USER_NETWORK
    if not network.isolated:
        return False
    firewall = Firewall(network)
    if firewall.in_place() or not (runtime or DockerRuntime()).has_network(network.name):
        return False
    log.error("the firewall of %s had lost its rules; writing them again", network.name)
    firewall.apply()
    return True


def tear_down(network: UserNetwork | None = None, runtime: DockerRuntime | None = None) -> None:
    """Remove the bridge (once no container uses it) and its rules."""
    network = network or settings.USER_NETWORK
    if not network.isolated:
        return
    (runtime or DockerRuntime()).remove_network(network.name)
    Firewall(network).remove()


def remove_stale(prefix: str, runtime: DockerRuntime, older_than: timedelta = timedelta(hours=2)) -> list[str]:
    """Remove networks (and their rules) left by runs that crashed: named ``prefix``*, old and empty."""
    removed = []
    for name, subnet, created in runtime.networks_named(prefix):
        if created is None or datetime.now(UTC) - created < older_than or runtime.containers_on(name):
            continue
        tear_down(parse(name, subnet, True, 1), runtime)
        removed.append(name)
    return removed
