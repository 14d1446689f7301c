"""The processes a lab host runs of its own, inside its namespace, as a GPU host runs them: its GPU agent and its
render worker. Each knows only its host's simulated GPUs and reaches the portal's PostgreSQL, Redis and file
store at the switch's address, through the relay, so a cut link silences it as it would a real host."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from django.conf import settings

from portal.celery import app, render_queue
from tests.conftest import ARTIFACTS, RUN_ID, STACK
from tests.helpers import processes
from tests.lab.fleet import fleet_spec
from tests.lab.lab import SWITCH_ADDRESS, Lab, Node

RENDER_THREADS = 2


def over_the_link(url: str) -> str:
    """This machine's service address as a lab host reaches it: the switch's address, through the relay."""
    return url.replace("@127.0.0.1:", f"@{SWITCH_ADDRESS}:").replace("//127.0.0.1:", f"//{SWITCH_ADDRESS}:")


def host_fleet(lab: Lab, node: Node) -> str:
    """PORTAL_SIMULATED_FLEET of one host: its own GPUs alone."""
    return "; ".join(part for part in fleet_spec(lab.name).split("; ") if part.startswith(f"{node.name}:"))


def host_env(lab: Lab, node: Node, **extra: str) -> dict[str, str]:
    env = processes.child_env(
        PORTAL_GPU_BACKEND="simulated",
        PORTAL_SIMULATED_FLEET=host_fleet(lab, node),
        PORTAL_GPU_HOST_NAME=node.name,
        PORTAL_GPU_NODE_ID=node.name,  # a machine of its own (the namespaces share this one's /etc/machine-id)
        **extra,
    )
    env.update(DATABASE_URL=over_the_link(env["DATABASE_URL"]), REDIS_URL=over_the_link(env["REDIS_URL"]))
    return env


def start_agent(lab: Lab, node: Node, heartbeat_s: int) -> subprocess.Popen[bytes]:
    env = host_env(lab, node, PORTAL_HOST_HEARTBEAT_S=str(heartbeat_s))
    command = [sys.executable, "manage.py", "gpu_agent", "--interval-ms", "500", "--no-docker"]
    return lab.start_in(node, command, env, ARTIFACTS / "logs" / f"lab-agent-{node.name}.log")


@contextlib.contextmanager
def running_agents(lab: Lab, heartbeat_s: int) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Every lab host's agent, beating every ``heartbeat_s``, stopped again at the end."""
    started = {node.name: start_agent(lab, node, heartbeat_s) for node in lab.nodes}
    try:
        yield started
    finally:
        for process in started.values():
            processes.stop(process)


def render_worker_name(node: Node) -> str:
    return f"render-{RUN_ID}@{node.name}"


def start_render_worker(lab: Lab, node: Node) -> subprocess.Popen[bytes]:
    """The host's render worker: it reads its host's render queue alone, starts chunks on its host's engine,
    and has no render folder: it fetches scenes from the portal's file store into its own scratch and gives
    frames back there. Its data folder is its own too (no key or file of the portal's machine)."""
    env = host_env(
        lab,
        node,
        PORTAL_RENDER_HOSTS=node.name,
        PORTAL_RENDER_FILE_STORE="portal",
        PORTAL_FILE_STORE_URL=f"http://{SWITCH_ADDRESS}:{STACK['portal']}",
        PORTAL_FILE_STORE_KEY=settings.FILE_STORE_KEY,
        PORTAL_RENDER_SCRATCH_DIR=str(node.folder / "scratch"),
        PORTAL_RENDER_DIR=str(node.folder / "no-render-folder"),
        PORTAL_DATA_DIR=str(node.folder / "portal-data"),
        PORTAL_RENDER_CHUNK_WALL_SECONDS="600",
        DOCKER_HOST=node.endpoint,
    )
    name = render_worker_name(node)
    command = [str(processes.BIN / "celery"), "--app", "portal", "worker", "--pool", "threads"]
    command += ["--concurrency", str(RENDER_THREADS), "--queues", render_queue(node.name), "--hostname", name]
    command += ["--without-gossip", "--without-mingle", "--loglevel", "INFO"]
    worker = lab.start_in(node, command, env, ARTIFACTS / "logs" / f"lab-render-{node.name}.log")
    ping = lambda: bool(app.control.ping(destination=[name], timeout=0.5))  # noqa: E731
    return processes.ready_or_stopped(worker, ping, 90, f"the render worker of {node.name}")
