"""The Docker network user containers live on: its name, subnet, bridge and the hub's address there.

Pure values, no Django and no Docker, so the hub's configuration and the
spawner (which run without Django) read the same facts as the portal.
Notebook servers sit on a bridge the portal owns; the only thing of ours
they may reach is the hub, listening on that bridge's gateway address.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

HOST = "host"  # the unsafe development mode: servers on the host's own network namespace
NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
DEFAULT_NAME = "gpu-portal"
DEFAULT_SUBNET = "10.88.0.0/24"
DEFAULT_HUB_PORT = 8081
# Where a notebook's connections are never forwarded, internet or not: every private, shared and special range
# (the host's LAN, other Docker networks, cloud metadata). PORTAL_NOTEBOOK_BLOCKED_RANGES replaces the list (a
# lab or an overlay the portal itself needs, say); link-local, where metadata services answer, and the
# notebooks' own subnet stay blocked whatever it says.
DEFAULT_BLOCKED = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
)
ALWAYS_BLOCKED = ("169.254.0.0/16",)


class NetworkSpecError(ValueError):
    """A network setting that cannot work; the message names the setting."""


@dataclass(frozen=True)
class UserNetwork:
    name: str
    subnet: ipaddress.IPv4Network
    internet: bool
    hub_port: int
    blocked: tuple[ipaddress.IPv4Network, ...] = tuple(ipaddress.IPv4Network(block) for block in DEFAULT_BLOCKED)

    @property
    def isolated(self) -> bool:
        return self.name != HOST

    @property
    def gateway(self) -> str:
        """The host's address on the bridge: the one address containers can reach us at."""
        return "127.0.0.1" if not self.isolated else str(next(self.subnet.hosts()))

    @property
    def bridge(self) -> str:
        """The Linux bridge's interface name (at most 15 characters), fixed so firewall rules can name it."""
        return "gp-" + hashlib.sha256(self.name.encode()).hexdigest()[:10]

    @property
    def hub_url(self) -> str:
        """Where the hub listens and where notebook servers reach it (hub_bind_url = hub_connect_url)."""
        return f"http://{self.gateway}:{self.hub_port}"


@dataclass(frozen=True)
class HostBridge(UserNetwork):
    """A Swarm GPU host's own container bridge (``docker0``), where its notebook tasks run (issue 32). The hub
    is not on it but at ``hub_address`` (the hub's machine, reached through the host's routes), and its proxy
    reaches the servers there at the ports they publish on the host's address."""

    interface: str = "docker0"
    hub_address: str = ""

    @property
    def bridge(self) -> str:
        return self.interface

    @property
    def hub_url(self) -> str:
        return f"http://{self.hub_address}:{self.hub_port}"


def host_bridge(network: UserNetwork, hub_url: str, interface: str = "docker0") -> HostBridge:
    """The fence of a Swarm host's bridge for the hub at ``hub_url`` (PORTAL_HUB_BIND_URL), with the user
    network's internet and blocked ranges; NetworkSpecError if the URL names no IPv4 address and port."""
    match = re.fullmatch(r"https?://(?P<host>[0-9.]+):(?P<port>\d+)/?", hub_url.strip())
    if not match:
        raise NetworkSpecError(
            f"PORTAL_HUB_BIND_URL must be http://ADDRESS:PORT with an IPv4 address (got {hub_url!r})."
        )
    try:
        address = ipaddress.IPv4Address(match["host"])
    except ValueError as error:
        raise NetworkSpecError(f"PORTAL_HUB_BIND_URL: {error}") from None
    if not NAME.match(interface) or len(interface) > 15:
        raise NetworkSpecError(f"the bridge must be a network interface's name (got {interface!r}).")
    return HostBridge(
        network.name, network.subnet, network.internet, int(match["port"]), network.blocked, interface, str(address)
    )


def parse(name: str, subnet: str, internet: bool, hub_port: int, blocked: str = "") -> UserNetwork:
    if name != HOST and not NAME.match(name):
        raise NetworkSpecError(f"PORTAL_NOTEBOOK_NETWORK must be a Docker network name or 'host' (got {name!r}).")
    try:
        network = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as error:
        raise NetworkSpecError(f"PORTAL_NOTEBOOK_SUBNET must be an IPv4 subnet such as 10.88.0.0/24: {error}") from None
    if not network.is_private or network.prefixlen > 28 or network.prefixlen < 16:
        raise NetworkSpecError(f"PORTAL_NOTEBOOK_SUBNET must be a private subnet between /16 and /28 (got {subnet!r}).")
    if not 1 <= hub_port <= 65535:
        raise NetworkSpecError(f"PORTAL_HUB_PORT must be a port number (got {hub_port}).")
    return UserNetwork(name, network, internet, hub_port, _blocked(blocked, network))


def _blocked(text: str, subnet: ipaddress.IPv4Network) -> tuple[ipaddress.IPv4Network, ...]:
    """The ranges a comma-separated setting names (empty: DEFAULT_BLOCKED), with ALWAYS_BLOCKED and the notebooks'
    own subnet added where the list does not already cover them."""
    ranges = []
    for item in [part.strip() for part in (text or ",".join(DEFAULT_BLOCKED)).split(",") if part.strip()]:
        try:
            ranges.append(ipaddress.IPv4Network(item, strict=True))
        except ValueError as error:
            raise NetworkSpecError(
                f"PORTAL_NOTEBOOK_BLOCKED_RANGES must list IPv4 ranges such as 10.0.0.0/8, comma-separated: {error}"
            ) from None
    for must in [*(ipaddress.IPv4Network(block) for block in ALWAYS_BLOCKED), subnet]:
        if not any(must.subnet_of(block) for block in ranges):
            ranges.append(must)
    return tuple(ranges)


def from_environ(environ: Mapping[str, str]) -> UserNetwork:
    """The same network the portal's settings describe, read where Django is not loaded (the hub)."""
    internet = environ.get("PORTAL_NOTEBOOK_INTERNET", "true").strip().lower() not in {"0", "false", "no", "off"}
    return parse(
        environ.get("PORTAL_NOTEBOOK_NETWORK", "").strip() or DEFAULT_NAME,
        environ.get("PORTAL_NOTEBOOK_SUBNET", "").strip() or DEFAULT_SUBNET,
        internet,
        int(environ.get("PORTAL_HUB_PORT", "").strip() or DEFAULT_HUB_PORT),
        environ.get("PORTAL_NOTEBOOK_BLOCKED_RANGES", ""),
    )
