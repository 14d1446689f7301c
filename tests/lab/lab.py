"""The multi-host lab (issue 32): three GPU hosts on this machine, each a network namespace with a Docker engine
of its own, joined into one Swarm through a bridge in a fourth namespace, the switch.

- Addresses exist only inside the lab's namespaces: the switch's bridge is 10.77.0.1/24 and the hosts
  10.77.0.11-13; no namespace has a route out, so nothing of the lab reaches another network (DESIGN.md,
  "Network rule"). The engines' own networks (docker0, docker_gwbridge, the Swarm's overlays) are made from
  10.78.0.0/16 and 10.79.0.0/16, again only inside the namespaces.
- Each engine has its own data root, exec root, socket, pid file and cgroup parent, and its own host name
  (its Swarm node's hostname), which is also the GPU host's name in the portal's fleet.
- Each engine's default runtime is the NVIDIA stand-in (compose/nvidia-standin/nvidia-container-runtime): it
  knows only its host's GPU and MIG device UUIDs and refuses a container asking for any other, as Swarm
  services carry the slice in NVIDIA_VISIBLE_DEVICES (Docker 20.10's services cannot carry device requests).
- Images are loaded into each engine from this machine's (``docker save`` once, ``docker load`` per node).

``down`` removes every trace: Swarm left, engines stopped, their containers' processes gone, mounts undone,
cgroups removed, namespaces deleted (with them their veths, bridges, iptables rules and docker_gwbridge);
``leftovers`` lists whatever is still there, and a test checks it is nothing.

By hand: ``make lab-up`` / ``make lab-down`` (``python -m tests.lab up|down|check``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STANDIN_RUNTIME = ROOT / "compose" / "nvidia-standin" / "nvidia-container-runtime"
DOCKER = "/usr/bin/docker"  # Debian's client: the one in /usr/local/bin may be another version
SUBNET = "10.77.0"
SWITCH_ADDRESS = f"{SUBNET}.1"
SWARM_POOL = "10.78.0.0/16"  # the Swarm's overlays (ingress, ours)
ENGINE_POOL = "10.79.0.0/16"  # each engine's local bridges (docker0, docker_gwbridge), inside its namespace
CGROUP_ROOT = Path("/sys/fs/cgroup")
BUSYBOX = "gpu-portal/busybox:latest"  # the images the lab's engines are given
NOTEBOOK = "gpu-portal/notebook:latest"
ENGINE_TLS_PORT = 2376  # Docker's port for an engine behind TLS
TEST_LAB = "gplt"  # the test suite's lab; not the one `make lab-up` builds (gpl), so the two never meet


class LabError(RuntimeError):
    """A step of bringing the lab up or down failed; the message says which and why."""


def run(*args: str, check: bool = True, timeout: float = 60, stdin: bytes | None = None) -> str:
    try:
        done = subprocess.run(args, input=stdin, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise LabError(f"{shlex.join(args)} did not finish within {timeout} s") from None
    if check and done.returncode:
        why = done.stderr.decode(errors="replace").strip() or done.stdout.decode(errors="replace").strip()
        raise LabError(f"{shlex.join(args)} failed ({done.returncode}): {why}")
    return done.stdout.decode(errors="replace")


@dataclass(frozen=True)
class Node:
    """One GPU host of the lab: its namespace, its engine and its devices."""

    lab: str
    index: int
    folder: Path

    @property
    def name(self) -> str:  # the host name, the Swarm node's hostname and the GPU host's name in the fleet
        return f"{self.lab}-n{self.index}"

    @property
    def netns(self) -> str:
        return self.name

    @property
    def address(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    @property
    def socket(self) -> Path:
        return self.folder / "docker.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pidfile(self) -> Path:
        return self.folder / "dockerd.pid"

    def docker(self, *args: str, check: bool = True, timeout: float = 60, stdin: bytes | None = None) -> str:
        return run(DOCKER, "-H", self.endpoint, *args, check=check, timeout=timeout, stdin=stdin)

    def answers(self) -> bool:
        return (
            self.socket.exists()
            and not subprocess.run(
                [DOCKER, "-H", self.endpoint, "version"], capture_output=True, timeout=10, check=False
            ).returncode
        )


@dataclass
class Lab:
    """A lab of ``size`` hosts named ``<name>-n1`` ...; its files under ``folder``.

    ``devices`` gives each host the GPU and MIG device UUIDs its NVIDIA stand-in knows (by host name).
    """

    name: str = "gpl"
    size: int = 3
    folder: Path = Path("/var/lib/gpu-portal-lab")
    devices: Mapping[str, Iterable[str]] = field(default_factory=dict)
    relay: Mapping[int, int] = field(default_factory=dict)  # the switch's port -> this machine's 127.0.0.1 port
    relay_into: Mapping[int, int] = field(default_factory=dict)  # this machine's port -> the switch's 127.0.0.1
    # Each engine also on tcp://<its address>:2376 with TLS both ways, its certificates in this folder
    # (tests/lab/certificates.py); None: on its socket alone.
    tls: Path | None = None

    def __post_init__(self) -> None:
        if not self.name.isalnum() or len(self.name) > 8:
            raise LabError(f"a lab's name is up to 8 letters and digits (it names namespaces): {self.name!r}")
        self.folder = self.folder / self.name

    @property
    def switch(self) -> str:
        return f"{self.name}-sw"

    @property
    def nodes(self) -> list[Node]:
        return [Node(self.name, index, self.folder / f"n{index}") for index in range(1, self.size + 1)]

    @property
    def manager(self) -> Node:
        return self.nodes[0]

    # -- up

    def up(self, images: Iterable[str] = ()) -> None:
        """Build the lab; on any failure, take down what was built and raise."""
        if self.leftovers():
            raise LabError(f"lab {self.name} is (partly) up already; `python -m tests.lab down` first")
        try:
            self._network()
            with ThreadPoolExecutor(self.size) as pool:
                list(pool.map(self._engine, self.nodes))
            self._images(list(images))
            self._swarm()
            self._ready()
            self._relay()
        except BaseException:
            self.down()
            raise

    def _network(self) -> None:
        run("ip", "netns", "add", self.switch)
        run("ip", "-n", self.switch, "link", "set", "lo", "up")
        run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.switch, "addr", "add", f"{SWITCH_ADDRESS}/24", "dev", "br0")
        run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for node in self.nodes:
            port = f"port{node.index}"
            run("ip", "netns", "add", node.netns)
            # Both ends are made inside the namespaces: no interface of the lab ever exists on this machine's side.
            run(
                "ip",
                "link",
                "add",
                "eth0",
                "netns",
                node.netns,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.switch,
            )
            run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            for device in ("lo", "eth0"):
                run("ip", "-n", node.netns, "link", "set", device, "up")
            run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            run("ip", "-n", self.switch, "link", "set", port, "up")

    def _engine(self, node: Node) -> None:
        node.folder.mkdir(parents=True, exist_ok=True)
        known = node.folder / "gpus"
        known.write_text("".join(f"{uuid}\n" for uuid in sorted(self.devices.get(node.name, ()))))
        runtime = node.folder / "nvidia-runtime"
        runtime.write_text(f'#!/bin/sh\nexec {STANDIN_RUNTIME} {known} "$@"\n')
        runtime.chmod(0o755)
        dockerd = [
            "dockerd",
            f"--data-root={node.folder / 'data'}",
            f"--exec-root={node.folder / 'exec'}",
            f"--pidfile={node.pidfile}",
            f"--host={node.endpoint}",
            f"--cgroup-parent={node.name}",
            f"--add-runtime=nvidia={runtime}",
            "--default-runtime=nvidia",
            f"--default-address-pool=base={ENGINE_POOL},size=24",
            "--log-level=warn",
        ]
        if self.tls is not None:
            dockerd += [f"--host=tcp://{node.address}:{ENGINE_TLS_PORT}", "--tlsverify"]
            dockerd += [f"--tlscacert={self.tls / 'ca.pem'}", f"--tlscert={self.tls / f'{node.name}-cert.pem'}"]
            dockerd += [f"--tlskey={self.tls / f'{node.name}-key.pem'}"]
        # nsenter, not `ip netns exec`, which remounts /sys and hides the cgroup mounts dockerd needs;
        # unshare --uts gives the node its own host name.
        script = f"hostname {node.name} && exec {shlex.join(dockerd)}"
        # The stand-in's hook on its PATH: a container with a GPU device request (a render chunk's) gets it, as
        # NVIDIA's hook gives it on a real host; the stand-in runtime then checks the devices asked for.
        path = f"{STANDIN_RUNTIME.parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        with (node.folder / "dockerd.log").open("ab") as log:
            subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--uts", "sh", "-c", script],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PATH": path},
            )
        deadline = time.monotonic() + 60
        while not node.answers():
            if time.monotonic() > deadline:
                tail = (node.folder / "dockerd.log").read_text(errors="replace")[-2000:]
                raise LabError(f"the engine of {node.name} did not answer within 60 s:\n{tail}")
            time.sleep(0.1)

    def _images(self, images: list[str]) -> None:
        self.load(images, self.nodes)

    def load(self, images: list[str], nodes: list[Node]) -> None:
        """Load images from this machine's engine into these hosts' engines (saved once, loaded side by side)."""
        if not images or not nodes:
            return
        archive = run_bytes(DOCKER, "save", *images)
        with ThreadPoolExecutor(len(nodes)) as pool:
            list(pool.map(lambda node: node.docker("load", "-q", stdin=archive, timeout=600), nodes))

    def _swarm(self) -> None:
        first = self.manager
        first.docker(
            "swarm", "init", f"--advertise-addr={first.address}", f"--listen-addr={first.address}:2377",
            f"--default-addr-pool={SWARM_POOL}", "--default-addr-pool-mask-length=24",
        )  # fmt: skip
        # One manager: a manager cut off and back campaigns, and the Swarm has no leader for some seconds after
        # (seen here with three); workers come and go without that, as GPU hosts do.
        token = first.docker("swarm", "join-token", "-q", "worker").strip()
        for node in self.nodes[1:]:
            node.docker(
                "swarm", "join", f"--token={token}", f"--advertise-addr={node.address}", f"{first.address}:2377"
            )

    def _ready(self) -> None:
        """Wait for every node to be Ready in the Swarm (each starts Unknown to a manager that just joined)."""
        deadline = time.monotonic() + 60
        while (seen := self.swarm_nodes()) != {node.name: "Ready" for node in self.nodes}:
            if time.monotonic() > deadline:
                raise LabError(f"the Swarm's nodes are not all ready within 60 s: {seen}")
            time.sleep(0.2)

    def _relay(self) -> None:
        """The way back to this machine's services (tests/lab/relay.py), for the processes inside the hosts."""
        if not self.relay and not self.relay_into:
            return
        pidfile = self.folder / "relay.pid"
        ports = [f"{listen}:{to}" for listen, to in sorted(self.relay.items())]
        ports += [f"--into={listen}:{to}" for listen, to in sorted(self.relay_into.items())]
        command = [sys.executable, "-m", "tests.lab.relay", self.switch, SWITCH_ADDRESS, *ports, f"--pidfile={pidfile}"]
        with (self.folder / "relay.log").open("ab") as log:
            relay = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 10
        while not pidfile.exists():
            if relay.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"the relay did not start: {(self.folder / 'relay.log').read_text()[-1000:]}")
            time.sleep(0.05)

    def start_in(
        self, node: Node | None, command: list[str], env: Mapping[str, str], log: Path, cwd: Path = ROOT
    ) -> subprocess.Popen[bytes]:
        """A process of ``node``'s, inside its namespace (its network only: it sees this machine's files), as a
        GPU host's agent or render worker runs there; it reaches the portal's services at the switch's address
        through the relay, so a cut link silences it. ``node`` None: in the switch's namespace, where the hub
        runs, reached by every host. Stopped by ``down`` if still running."""
        netns = self.switch if node is None else node.netns
        wrapped = ["nsenter", f"--net=/run/netns/{netns}", "--", *command]
        with log.open("ab") as out:
            return subprocess.Popen(
                wrapped, cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def connects(self, node: Node | None, address: str, port: int) -> bool:
        """Whether a TCP connection from ``node``'s namespace (None: the switch's) to ``address:port`` opens."""
        netns = self.switch if node is None else node.netns
        return run("nsenter", f"--net=/run/netns/{netns}", "--", *connect_probe(sys.executable, address, port)) == "0\n"

    # -- state

    def swarm_nodes(self) -> dict[str, str]:
        """Each Swarm node's hostname and state, as the manager sees them (empty while it does not answer)."""
        try:
            listed = self.manager.docker("node", "ls", "--format", "{{json .}}", check=False, timeout=5)
        except LabError:
            return {}
        rows = [json.loads(line) for line in listed.splitlines() if line.strip().startswith("{")]
        return {row["Hostname"]: row["Status"] for row in rows}

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise LabError(f"no host {name!r} in lab {self.name}")

    def cut(self, node: Node) -> None:
        """Cut a host's link, as a pulled cable: its namespace keeps running, the others stop hearing it."""
        run("ip", "-n", self.switch, "link", "set", f"port{node.index}", "down")

    def mend(self, node: Node) -> None:
        """Put the cable back; returns once the Swarm has the host back (Ready)."""
        run("ip", "-n", self.switch, "link", "set", f"port{node.index}", "up")
        self._ready()

    def kill_engine(self, node: Node) -> None:
        """The host's dockerd dies (SIGKILL: no goodbye to the Swarm); its namespace and the rest run on."""
        _signal(int(node.pidfile.read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while node.answers():
            if time.monotonic() > deadline:
                raise LabError(f"the engine of {node.name} still answers after SIGKILL")
            time.sleep(0.1)

    def start_engine(self, node: Node) -> None:
        """Start the host's dockerd again on its data (as its supervisor would); returns once the Swarm has the
        host back (Ready)."""
        node.pidfile.unlink(missing_ok=True)
        self._engine(node)
        self._ready()

    def leave(self, node: Node) -> None:
        """The host leaves the Swarm (as an operator takes it out: `docker swarm leave`, then the manager
        forgets it); its engine runs on."""
        node.docker("swarm", "leave", "--force", timeout=30)
        deadline = time.monotonic() + 30
        while self.swarm_nodes().get(node.name) not in ("Down", None):
            if time.monotonic() > deadline:
                raise LabError(f"{node.name} left the Swarm but the manager still has it {self.swarm_nodes()}")
            time.sleep(0.2)
        self.manager.docker("node", "rm", "--force", node.name, check=False)

    def rejoin(self, node: Node) -> None:
        """The host joins the Swarm again as a worker; returns once every node is Ready."""
        token = self.manager.docker("swarm", "join-token", "-q", "worker").strip()
        node.docker(
            "swarm", "join", f"--token={token}", f"--advertise-addr={node.address}", f"{self.manager.address}:2377"
        )
        self._ready()

    # -- down

    def down(self) -> None:
        """Take everything of the lab down, whatever state it is in; safe to call twice."""
        for node in self.nodes:
            if node.answers():
                node.docker("swarm", "leave", "--force", check=False, timeout=20)
        for node in self.nodes:
            self._stop_engine(node)
        self._kill(self._processes())
        for mount in reversed(self._mounts()):
            run("umount", "-l", mount, check=False)
        for group in self._cgroups():
            remove_cgroup(group)
        for netns in self._namespaces():
            self._kill(namespace_pids(netns))
            run("ip", "netns", "del", netns, check=False)
        if self.folder.exists():
            # Three engines' image layers: on a busy disk this takes more than a minute.
            run("rm", "-rf", "--one-file-system", str(self.folder), check=False, timeout=300)

    def _stop_engine(self, node: Node) -> None:
        try:
            pid = int(node.pidfile.read_text())
        except (OSError, ValueError):
            return
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal(pid, signal.SIGKILL)

    def _kill(self, pids: Iterable[int]) -> None:
        pids = [pid for pid in pids if pid != os.getpid()]
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)

    # -- what is left

    def _namespaces(self) -> list[str]:
        ours = {self.switch, *(node.netns for node in self.nodes)}
        listed = run("ip", "netns", "list", check=False)
        return [line.split()[0] for line in listed.splitlines() if line.split() and line.split()[0] in ours]

    def _mounts(self) -> list[str]:
        prefix = f"{self.folder}/"
        found = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            point = line.split()[1].encode().decode("unicode_escape")
            if point.startswith(prefix) or point == str(self.folder):
                found.append(point)
        return found

    def _cgroups(self) -> list[Path]:
        names = {node.name for node in self.nodes}
        found = []
        for controller in CGROUP_ROOT.iterdir() if CGROUP_ROOT.exists() else ():
            for name in names:
                if (controller / name).is_dir():
                    found.append(controller / name)
        return found

    def _processes(self) -> list[int]:
        """Processes of the lab: its engines' (and their containerd's and shims') by their command lines,
        and whatever runs inside its namespaces."""
        marker = str(self.folder).encode()
        found = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if marker in (entry / "cmdline").read_bytes():
                        found.add(int(entry.name))
                except OSError:
                    continue
        for netns in self._namespaces():
            found.update(namespace_pids(netns))
        found.discard(os.getpid())
        return sorted(found)

    def leftovers(self) -> list[str]:
        """Everything of this lab still on the machine, in words; empty once it is all gone."""
        left = [f"network namespace {netns}" for netns in self._namespaces()]
        left += [f"mount {mount}" for mount in self._mounts()]
        left += [f"cgroup {group}" for group in self._cgroups()]
        left += [f"process {pid}: {_cmdline(pid)}" for pid in self._processes()]
        links = run("ip", "-o", "link", "show", check=False)
        left += [f"link on this machine: {line.split(':')[1].strip()}" for line in links.splitlines() if _ours(line)]
        rules = run("iptables-save", check=False)
        left += [f"iptables rule: {line}" for line in rules.splitlines() if SUBNET in line or "docker_gwbridge" in line]
        if self.folder.exists():
            left.append(f"folder {self.folder}")
        return left


def connect_probe(python: str, address: str, port: int) -> list[str]:
    """A command that prints 0 if a TCP connection to ``address:port`` opens within 3 s (else an errno)."""
    code = f"import socket; s = socket.socket(); s.settimeout(3); print(s.connect_ex(({address!r}, {port})))"
    return [python, "-c", code]


def run_bytes(*args: str, timeout: float = 600) -> bytes:
    done = subprocess.run(args, capture_output=True, timeout=timeout, check=False)
    if done.returncode:
        raise LabError(f"{shlex.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def namespace_pids(netns: str) -> list[int]:
    return [int(pid) for pid in run("ip", "netns", "pids", netns, check=False).split() if pid.isdigit()]


def remove_cgroup(group: Path) -> None:
    """A cgroup folder and those under it, deepest first (a cgroup is removed with rmdir, once empty)."""
    for below in sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            below.rmdir()
    with contextlib.suppress(OSError):
        group.rmdir()


def _ours(line: str) -> bool:
    name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
    return name == "docker_gwbridge" or (name.startswith("port") and name[4:].isdigit())


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] if Path(f"/proc/{pid}").exists() else "X"
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"
