"""The real `make run` (compose/bin/run) in a data directory of its own, watched through its supervisord.

Free ports, its own Redis prefixes and Celery queue on the test run's Redis, its own notebook network
(10.88.200-250.0/24), SQLite in the data directory, as `make run` uses by default.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import uuid
import xmlrpc.client
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from supervisor.xmlrpc import SupervisorTransport

from tests.helpers.processes import answers_200, free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKER = "/usr/bin/docker"
# Variables the run must work out for itself, or that would point it at the test run's own services.
NOT_PASSED = (
    "DATABASE_URL",
    "PORTAL_PUBLIC_URL",
    "PORTAL_INTERNAL_URL",
    "PORTAL_HUB_API_URL",
    "PORTAL_HUB_SERVICE_TOKEN",
    "PORTAL_HUB_STARTS_PROXY",
    "CONFIGPROXY_AUTH_TOKEN",
    "PORTAL_SUPERVISOR_PASSWORD",
)


def taken_subnets() -> set[str]:
    ids = subprocess.run([DOCKER, "network", "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    if not ids:
        return set()
    found = subprocess.run(
        [DOCKER, "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *ids],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(found.split())


def free_subnet() -> str:
    taken = taken_subnets()
    free = [f"10.88.{n}.0/24" for n in range(200, 251) if f"10.88.{n}.0/24" not in taken]
    if not free:
        raise RuntimeError("every 10.88.200-250.0/24 is taken; remove old gpu-portal-run-* networks")
    return random.choice(free)


def group_members(pgid: int) -> list[int]:
    """Live processes in a process group (zombies count as gone)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


class SupervisedRun:
    def __init__(self, data: Path, log_path: Path, piped: bool = False, **extra: str) -> None:
        """``piped``: its output goes into a pipe the test holds, as in `make run | tee run.log`."""
        self.piped = piped
        tag = uuid.uuid4().hex[:8]
        self.data = data
        self.ports = {name: free_port() for name in ("public", "internal", "hub", "proxy_api")}
        self.network = f"gpu-portal-run-{tag}"
        self.subnet = free_subnet()
        self.queue = f"run-{tag}"
        self.env = {key: value for key, value in os.environ.items() if key not in NOT_PASSED}
        self.env.update(
            PORTAL_DATA_DIR=str(data),
            PORTAL_PORT=str(self.ports["public"]),
            PORTAL_INTERNAL_PORT=str(self.ports["internal"]),
            PORTAL_HUB_PORT=str(self.ports["hub"]),
            PORTAL_PROXY_API_PORT=str(self.ports["proxy_api"]),
            REDIS_URL=settings.REDIS_URL,
            PORTAL_CELERY_QUEUE=self.queue,
            PORTAL_CACHE_PREFIX=self.queue,
            PORTAL_CHANNEL_PREFIX=self.queue,
            PORTAL_NOTEBOOK_NETWORK=self.network,
            PORTAL_NOTEBOOK_SUBNET=self.subnet,
            **extra,
        )
        self.log = log_path.open("ab")
        self.seen_groups: set[int] = set()
        self.answered_at_announcement: bool | None = None  # answered_when_announced's finding, where a test asked
        self.process = self.start()

    def start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [str(ROOT / "compose/bin/run")],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if self.piped else self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's Ctrl-C would reach it
        )
        self.seen_groups.add(process.pid)
        return process

    def crash(self) -> None:
        """supervisord dies (kill -9); its programs are left running."""
        self.programs()
        self.process.kill()  # compose/bin/run became supervisord (exec)
        self.process.wait()

    def start_again(self) -> None:
        self.process = self.start()

    # Addresses
    @property
    def public(self) -> str:
        return f"http://127.0.0.1:{self.ports['public']}"

    @property
    def daphne(self) -> str:
        return f"http://127.0.0.1:{self.ports['internal']}"

    @property
    def hub_api(self) -> str:
        """The hub's API where it listens: the notebook network's gateway."""
        gateway = self.subnet.replace(".0/24", ".1")
        return f"http://{gateway}:{self.ports['hub']}/jupyter/hub/api/"

    @property
    def worker_name(self) -> str:
        return f"{self.queue}@{socket.gethostname()}"

    # The supervisor
    def rpc(self) -> Any:
        password = (self.data / "supervisor/password").read_text().strip()
        transport = SupervisorTransport("portal", password, f"unix://{self.data}/supervisor/supervisor.sock")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    def programs(self) -> dict[str, dict[str, Any]]:
        """Each program's state and pid, by its name (web, hub, ..., console, revive)."""
        infos = {info["name"]: info for info in self.rpc().supervisor.getAllProcessInfo()}
        self.seen_groups.update(info["pid"] for info in infos.values() if info["pid"])
        return infos

    def pids(self) -> dict[str, int]:
        return {name: info["pid"] for name, info in self.programs().items()}

    # Checks
    def worker_answers(self) -> bool:
        from portal.celery import app

        return bool(app.control.ping(destination=[self.worker_name], timeout=1))

    def wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Until check() holds, while the run is still running."""

        def running_and(check: Callable[[], bool]) -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"make run exited with {self.process.returncode} while waiting for {what}")
            return check()

        self.wait_for(lambda: running_and(check), timeout, what)

    @staticmethod
    def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except (OSError, xmlrpc.client.Fault):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{what}: not within {timeout} s (see artifacts/logs/)")

    def answered_when_announced(self, log_path: Path, timeout: float) -> bool:
        """Wait for the run to print its address, then say whether the address answers at that moment."""
        announcement = f"GPU portal: open {self.public}/"
        self.wait(lambda: announcement in log_path.read_text(errors="replace"), timeout, "the address printed")
        return answers_200(f"{self.public}/healthz")

    def ready(self, timeout: float) -> None:
        # This run's supervisord first: after a crash the programs it left still answer on their ports while
        # the new run's start-up (migrations, discovery, the network) takes its time on a slow machine.
        self.wait(lambda: self.rpc().supervisor.getState()["statename"] == "RUNNING", timeout, "supervisord")
        self.wait(lambda: answers_200(f"{self.public}/healthz"), timeout, "the portal through the proxy")
        self.wait(lambda: answers_200(f"{self.public}/jupyter/hub/api/"), 60, "the hub through the proxy")
        self.wait(lambda: answers_200(self.hub_api), 30, "the hub's own address")
        self.wait(self.worker_answers, 60, "the Celery worker")
        self.wait(lambda: all(i["statename"] == "RUNNING" for i in self.programs().values()), 30, "every program")

    # The end
    def interrupt(self, timeout: float) -> int:
        """Ctrl-C: SIGINT to the run's process group; its exit status."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout=timeout)

    def left_behind(self) -> dict[int, list[int]]:
        return {group: members for group in self.seen_groups if (members := group_members(group))}

    def clean_up(self) -> None:
        """Whatever happened: nothing of this run keeps running, and its network goes."""
        if self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.interrupt(timeout=60)
        for group in self.seen_groups:
            for pid in group_members(group):
                os.kill(pid, signal.SIGKILL)
        self.log.close()
        subprocess.run(
            [str(ROOT / ".venv/bin/python"), "manage.py", "ensure_user_network", "--remove"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            check=False,
        )
        subprocess.run([DOCKER, "network", "rm", self.network], capture_output=True, check=False)
