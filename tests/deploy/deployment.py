"""The portal deployed as containers on this machine's engine, for the smoke tests (issue 33): brought up with
Debian's docker-compose from compose/compose.yaml, or with `docker stack deploy` from compose/stack.yaml on a
one-node Swarm the test makes and leaves; then torn down, and what it left behind listed.

Every address is this machine's 127.0.0.1 (free ports chosen at start) or inside what the test makes: the
notebook network on a 10.88.N.0/24 no other network holds, and the one-node Swarm's own networks."""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

DOCKER = "/usr/bin/docker"
COMPOSE = shutil.which("docker-compose") or "/usr/bin/docker-compose"
SWARM_POOL = "10.76.0.0/16"  # the one-node Swarm's own networks (ingress), made and removed by the test
SERVICES = ["postgres", "redis", "web", "worker", "estimate", "beat", "fence", "hub", "proxy", "agent", "render"]


def run(*command: str, env: dict[str, str] | None = None, timeout: float = 300, check: bool = True) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command[:6])} ... exited {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_subnet() -> str:
    taken = set(run(DOCKER, "network", "inspect", *run(DOCKER, "network", "ls", "-q").split()).split('"Subnet": "'))
    for n in range(60, 100):
        subnet = f"10.88.{n}.0/24"
        if not any(entry.startswith(subnet) for entry in taken):
            return subnet
    raise RuntimeError("every 10.88.60-99.0/24 is taken by a Docker network")


def build_images() -> None:
    """The stack's images, offline; what exists on the machine is reused (each script skips a built hash)."""
    for script in ("build-stack-images", "build-notebook-image", "build-render-image"):
        subprocess.run([str(ROOT / "compose/bin" / script)], check=True, timeout=1500, capture_output=True)


@dataclass
class Deployment:
    mode: str  # "compose" or "swarm"
    name: str = field(default_factory=lambda: "gpsmoke" + secrets.token_hex(3))
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-portal-deploy-", dir="/var/tmp")))
    secrets: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env_file = self.folder / "portal.env"
        run(str(ROOT / "compose/bin/make-stack-env"), str(self.env_file))
        if self.secrets:
            self.env_file.write_text("".join(f"{key}={value}\n" for key, value in self.secrets.items()))
        self.port = free_port()
        self.render_dir = self.folder / "render"
        run("install", "-d", "-o", "10001", "-g", "10001", str(self.render_dir))  # the portal's user writes there
        self.settings.update(self.read_env())
        self.settings.update(
            PORTAL_PUBLIC_URL=f"http://127.0.0.1:{self.port}",
            PORTAL_PORT=str(self.port),
            PORTAL_PROXY_IP="127.0.0.1",
            PORTAL_WEB_PORT=str(free_port()),
            PORTAL_PROXY_API_PORT=str(free_port()),
            PORTAL_DATABASE_PORT=str(free_port()),
            PORTAL_REDIS_PORT=str(free_port()),
            PORTAL_STACK_NAME=self.name,
            PORTAL_NOTEBOOK_NETWORK=f"{self.name}-notebooks",
            PORTAL_NOTEBOOK_SUBNET=free_subnet(),
            PORTAL_RENDER_DIR=str(self.render_dir),
        )
        self.env_file.write_text("".join(f"{key}={value}\n" for key, value in self.settings.items()))

    def read_env(self) -> dict[str, str]:
        lines = self.env_file.read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))

    @property
    def admin(self) -> tuple[str, str]:
        return self.settings.get("PORTAL_ADMIN_USERNAME", "admin"), self.settings["PORTAL_ADMIN_PASSWORD"]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        command = [COMPOSE, "--env-file", str(self.env_file), "-f", str(ROOT / "compose/compose.yaml")]
        return run(*command, "-p", self.name, *args, timeout=timeout, check=check)

    # -- up ---------------------------------------------------------------------------------------------------

    def up(self) -> None:
        if self.mode == "compose":
            self.compose("up", "-d", "--no-build")
            return
        run(DOCKER, "swarm", "init", "--advertise-addr", "127.0.0.1", f"--default-addr-pool={SWARM_POOL}")
        node = run(DOCKER, "info", "--format", "{{.Swarm.NodeID}}").strip()
        run(DOCKER, "node", "update", "--label-add", "gpu-portal.gpu-host=true", node)
        self.deploy()

    def deploy(self) -> str:
        return run(str(ROOT / "compose/bin/stack"), str(self.env_file), "deploy", self.name, timeout=300)

    def containers(self, service: str, every: bool = False) -> list[str]:
        if self.mode == "compose":
            labels = [f"com.docker.compose.project={self.name}", f"com.docker.compose.service={service}"]
        else:
            labels = [f"com.docker.swarm.service.name={self.name}_{service}"]
        filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
        return run(DOCKER, "ps", "-q", *(["-a"] if every else []), *filters).split()

    def health(self) -> dict[str, str]:
        """Each long-running service's health as its container reports it ("" when it has no running one)."""
        found = {}
        for service in SERVICES:
            ids = self.containers(service)
            states = [run(DOCKER, "inspect", "--format", "{{.State.Health.Status}}", one).strip() for one in ids]
            found[service] = states[0] if len(states) == 1 else ",".join(states)
        return found

    def wait_healthy(self, timeout: float = 420) -> None:
        deadline, seen = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            seen = self.health()
            if all(state == "healthy" for state in seen.values()):
                return
            time.sleep(3)
        logs = {service: self.logs(service)[-1500:] for service, state in seen.items() if state != "healthy"}
        raise AssertionError(f"not healthy within {timeout:.0f} s: {seen}\n{json.dumps(logs, indent=1)}")

    def shown_by_compose(self) -> None:
        """What `docker-compose ps` and `logs` show an operator (docs/operating.md): every service up and
        healthy, the set-up exited 0, and the programs' own lines."""
        listed = self.compose("ps")
        assert all(f"_{service}_1" in listed for service in SERVICES), listed
        assert listed.count("(healthy)") == len(SERVICES) and "Exit 0" in listed, listed
        logged = self.compose("logs", "--tail", "5", "web")
        assert logged.count("web_1") >= 5, logged

    def lives(self, service: str) -> tuple[str, ...]:
        """Which run of the service's program this is: its containers with their restart counts. A restart
        by the policy counts up; Swarm's new task is another container."""
        ids = self.containers(service)
        return tuple(
            f"{one[:12]}:{run(DOCKER, 'inspect', '--format', '{{.RestartCount}}', one).strip()}" for one in ids
        )

    def restarted(self, service: str, before: tuple[str, ...], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.lives(service)
            if now and now != before:
                return
            time.sleep(0.5)
        raise AssertionError(f"{service} was not started again within {timeout:.0f} s ({before})")

    def running(self) -> dict[str, list[str]]:
        """The running containers of each service."""
        return {service: sorted(self.containers(service)) for service in SERVICES}

    def logs(self, service: str) -> str:
        ids = self.containers(service, every=True)
        return "".join(run(DOCKER, "logs", "--tail", "40", one, check=False) for one in ids[:1]) + "".join(
            subprocess.run([DOCKER, "logs", "--tail", "40", one], capture_output=True, text=True).stderr
            for one in ids[:1]
        )

    def manage(self, *args: str, service: str = "web") -> str:
        """`manage.py ...` in the service's running container, with its settings."""
        (container,) = self.containers(service)
        return run(DOCKER, "exec", container, "python", "manage.py", *args, timeout=300)

    def python(self, code: str, service: str = "web") -> Any:
        """The JSON that ``code`` (run by manage.py shell, with the portal's settings) prints last."""
        out = self.manage("shell", "--no-imports", "-c", code, service=service)
        return json.loads(out.strip().splitlines()[-1])

    # -- down -------------------------------------------------------------------------------------------------

    def down(self, work_volumes: list[str]) -> None:
        if self.mode == "compose":
            self.compose("stop", "fence", "hub", check=False)
            self.unfence()
            self.compose("down", "-v", "--remove-orphans", timeout=300)
        else:
            run(DOCKER, "stack", "rm", self.name, check=False)
            deadline = time.monotonic() + 120
            while self.stack_containers() and time.monotonic() < deadline:
                time.sleep(2)
            self.unfence()
            for volume in run(
                DOCKER, "volume", "ls", "-q", "--filter", f"label=com.docker.stack.namespace={self.name}"
            ).split():
                run(DOCKER, "volume", "rm", volume, check=False)
            run(DOCKER, "swarm", "leave", "--force", check=False)
            run(DOCKER, "network", "rm", "docker_gwbridge", check=False)
        for volume in work_volumes:  # people's work folders: kept by a `down`, as an operator wants them
            run(DOCKER, "volume", "rm", volume, check=False)

    def unfence(self) -> None:
        """The notebook network and its rules, removed as the operator's guide says; first the containers the
        portal started that a failed test left running (a session it did not get to stop)."""
        instance = f"label=gpu-portal.instance={self.settings['PORTAL_INSTANCE_ID']}"
        for container in run(DOCKER, "ps", "-aq", "--filter", instance).split():
            run(DOCKER, "rm", "-f", container, check=False)
        command = [DOCKER, "run", "--rm", "--network", "host", "--cap-add", "NET_ADMIN", "--user", "root"]
        command += ["-v", "/var/run/docker.sock:/var/run/docker.sock", "--env-file", str(self.env_file)]
        command += ["-e", "PORTAL_SECRETS_FROM_ENVIRONMENT=true", "gpu-portal/portal:latest"]
        run(*command, "python", "manage.py", "ensure_user_network", "--remove", check=False, timeout=120)

    def stack_containers(self) -> list[str]:
        return run(DOCKER, "ps", "-aq", "--filter", f"label=com.docker.stack.namespace={self.name}").split()

    def leftovers(self) -> list[str]:
        """What the deployment left on the engine and host: containers, networks, volumes, iptables rules."""
        left = []
        for kind in ("ps -a", "network ls", "volume ls"):
            listed = run(DOCKER, *kind.split(), "--format", "{{.Names}}" if kind == "ps -a" else "{{.Name}}")
            left += [f"{kind}: {name}" for name in listed.split() if self.name in name]
        instance = self.settings["PORTAL_INSTANCE_ID"]
        left += [
            f"container of the portal: {c}"
            for c in run(DOCKER, "ps", "-aq", "--filter", f"label=gpu-portal.instance={instance}").split()
        ]
        rules = run("iptables-save", check=False)
        prefix = self.settings["PORTAL_NOTEBOOK_SUBNET"].rsplit(".", 1)[0] + "."  # the subnet's and its gateway's
        left += [f"iptables: {line}" for line in rules.splitlines() if prefix in line]
        if self.mode == "swarm":
            state = run(DOCKER, "info", "--format", "{{.Swarm.LocalNodeState}}").strip()
            if state != "inactive":
                left.append(f"the engine is still in a Swarm ({state})")
            left += ["network: docker_gwbridge"] if "docker_gwbridge" in run(DOCKER, "network", "ls") else []
        return left


@contextlib.contextmanager
def deployed(mode: str, secrets_of: Deployment | None = None) -> Iterator[Deployment]:
    """A deployment up and healthy; torn down after, and nothing of it may be left. ``secrets_of``: a fresh
    stack with an earlier one's secrets, as a restore after a disaster has them from the operator's vault."""
    deployment = Deployment(mode, secrets=dict(secrets_of.settings) if secrets_of else {})
    work_volumes: list[str] = []
    try:
        deployment.up()
        deployment.wait_healthy()
        if mode == "compose":
            deployment.shown_by_compose()
        yield deployment
    finally:
        with contextlib.suppress(AssertionError, ValueError, subprocess.TimeoutExpired):
            work_volumes = deployment.python(WORK_VOLUMES)
        deployment.down(work_volumes)
        left = deployment.leftovers()
        shutil.rmtree(deployment.folder, ignore_errors=True)
    assert not left, left


WORK_VOLUMES = """
import json
from sessions.notebooks.models import WorkVolume
print(json.dumps(list(WorkVolume.objects.values_list("name", flat=True))))
"""
