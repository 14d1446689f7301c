"""The host firewall around the user-container bridge: the only module that runs iptables.

A Docker bridge alone keeps a container off the host's 127.0.0.1, but the
container still reaches every host address through the bridge's gateway
(anything bound to 0.0.0.0) and, routed onwards, the host's local networks.
Two chains close that, keyed by the bridge's interface name:

- INPUT: from the bridge, only the hub's port on the gateway (and replies to
  connections the host opened, such as the proxy's); everything else is
  refused with a reset, so a probe fails at once instead of hanging.
- FORWARD (through Docker's DOCKER-USER chain): no private, link-local or
  shared address ranges (the host's LAN, cloud metadata services, other
  Docker networks), except DNS to the host's own resolvers; the internet
  only when the setting allows it.

IPv6 is refused on the bridge altogether; the containers also run with it off.
Rules are written with iptables-restore, so a chain never stands half-written.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sessions.runtime.network import HostBridge, UserNetwork


class FirewallError(RuntimeError):
    """The rules could not be read or written; the message says what and how to fix it."""


@dataclass(frozen=True)
class Chains:
    inbound: str
    outbound: str
    published: str


def chains_for(network: UserNetwork) -> Chains:
    tag = hashlib.sha256(network.bridge.encode()).hexdigest()[:8].upper()
    return Chains(f"GPU-PORTAL-IN-{tag}", f"GPU-PORTAL-OUT-{tag}", f"GPU-PORTAL-PUB-{tag}")


def host_resolvers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """IPv4 name servers the host uses: Docker's embedded DNS forwards notebooks' lookups to them."""
    found: list[str] = []
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                address = ipaddress.ip_address(words[1])
            except ValueError:
                continue
            if address.version == 4 and not address.is_loopback:
                found.append(str(address))
    return found


def inbound_rules(network: UserNetwork, chain: str) -> list[str]:
    hub = (
        []
        if isinstance(network, HostBridge)
        else [f"-A {chain} -p tcp -d {network.gateway} --dport {network.hub_port} -j ACCEPT"]
    )
    return [
        f"-A {chain} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        *hub,  # on a Swarm host the hub is elsewhere: nothing of the host itself answers its containers
        f"-A {chain} -p tcp -j REJECT --reject-with tcp-reset",
        f"-A {chain} -j REJECT --reject-with icmp-admin-prohibited",
    ]


def outbound_rules(network: UserNetwork, chain: str, resolvers: list[str]) -> list[str]:
    refuse = "-j REJECT --reject-with icmp-admin-prohibited"
    rules = []
    if isinstance(network, HostBridge):  # replies to the hub's proxy, and the hub itself, across the hosts' network
        rules += [
            f"-A {chain} -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
            f"-A {chain} -p tcp -d {network.hub_address} --dport {network.hub_port} -j RETURN",
        ]
    if not network.internet:
        return [*rules, f"-A {chain} {refuse}"]
    rules += [f"-A {chain} -p {proto} -d {ip} --dport 53 -j RETURN" for ip in resolvers for proto in ("udp", "tcp")]
    rules += [f"-A {chain} -d {blocked} {refuse}" for blocked in network.blocked]
    return [*rules, f"-A {chain} -j RETURN"]


def published_rules(network: HostBridge, chain: str) -> list[str]:
    """New connections into a Swarm host's containers (the ports their tasks publish on the host's address):
    from the hub's machine (its proxy) only."""
    return [
        f"-A {chain} -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
        f"-A {chain} -s {network.hub_address} -j RETURN",
        f"-A {chain} -p tcp -j REJECT --reject-with tcp-reset",
        f"-A {chain} -j REJECT --reject-with icmp-admin-prohibited",
    ]


class Firewall:
    """Applies, checks and removes the rules of one user network. Needs root."""

    def __init__(self, network: UserNetwork) -> None:
        self.network = network
        self.chains = chains_for(network)
        self.hooks = [
            ("INPUT", f"-i {network.bridge} -j {self.chains.inbound}"),
            ("DOCKER-USER", f"-i {network.bridge} -j {self.chains.outbound}"),
        ]
        if isinstance(network, HostBridge):
            self.hooks.append(("DOCKER-USER", f"-o {network.bridge} -j {self.chains.published}"))
        self.hooks6 = [("INPUT", f"-i {network.bridge} -j DROP"), ("FORWARD", f"-i {network.bridge} -j DROP")]

    def apply(self) -> None:
        """Write both chains in one transaction, then hook them in first (idempotent)."""
        chains, network = self.chains, self.network
        published = []
        if isinstance(network, HostBridge):
            published = [f":{chains.published} - [0:0]", *published_rules(network, chains.published)]
        script = [
            "*filter",
            f":{chains.inbound} - [0:0]",
            f":{chains.outbound} - [0:0]",
            *inbound_rules(network, chains.inbound),
            *outbound_rules(network, chains.outbound, host_resolvers()),
            *published,
            "COMMIT",
            "",
        ]
        self._run("iptables-restore", ["-w", "--noflush"], stdin="\n".join(script))
        self._run("iptables", ["-w", "-N", "DOCKER-USER"], ok_if_fails=True)  # Docker makes it; ours may start first
        for chain, rule in self.hooks:
            self._hook("iptables", chain, rule)
        if self._tool("ip6tables", required=False):
            for chain, rule in self.hooks6:
                self._hook("ip6tables", chain, rule)

    def in_place(self) -> bool:
        """Whether every hook is there (Docker or an operator may have flushed a chain)."""
        return all(self._has("iptables", chain, rule) for chain, rule in self.hooks)

    def remove(self) -> None:
        for chain, rule in self.hooks:
            while self._has("iptables", chain, rule):
                self._run("iptables", ["-w", "-D", chain, *rule.split()])
        if self._tool("ip6tables", required=False):
            for chain, rule in self.hooks6:
                while self._has("ip6tables", chain, rule):
                    self._run("ip6tables", ["-w", "-D", chain, *rule.split()])
        for name in (self.chains.inbound, self.chains.outbound, self.chains.published):
            self._run("iptables", ["-w", "-F", name], ok_if_fails=True)
            self._run("iptables", ["-w", "-X", name], ok_if_fails=True)

    def rules(self) -> str:
        """The two chains as iptables prints them, for operators and tests."""
        chains = (self.chains.inbound, self.chains.outbound, self.chains.published)
        return "".join(self._run("iptables", ["-w", "-S", name], ok_if_fails=True) or "" for name in chains)

    def _hook(self, tool: str, chain: str, rule: str) -> None:
        if not self._has(tool, chain, rule):
            self._run(tool, ["-w", "-I", chain, "1", *rule.split()])

    def _has(self, tool: str, chain: str, rule: str) -> bool:
        return self._run(tool, ["-w", "-C", chain, *rule.split()], ok_if_fails=True) is not None

    def _tool(self, name: str, required: bool = True) -> str | None:
        found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if found is None and required:
            raise FirewallError(f"{name} is not installed; isolating user containers needs it (Debian: iptables).")
        return found

    def _run(self, tool: str, args: list[str], stdin: str | None = None, ok_if_fails: bool = False) -> str | None:
        executable = self._tool(tool)
        assert executable is not None
        result = subprocess.run([executable, *args], input=stdin, capture_output=True, text=True, check=False)
        if result.returncode == 0:
            return result.stdout
        if ok_if_fails:
            return None
        hint = " (run as root)" if "Permission denied" in result.stderr or "must be root" in result.stderr else ""
        raise FirewallError(f"{tool} {' '.join(args)} failed{hint}: {result.stderr.strip()}")
