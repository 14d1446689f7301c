"""The portal as a Swarm stack over several GPU hosts (compose/stack.yaml with compose/swarm-hosts.yaml), on the
multi-host lab (tests/lab): the manager (the lab's first host) runs the portal, PostgreSQL, Redis, the hub and
the public entry; the two GPU hosts run their agent, render worker and fence, each in its own network
namespace with its own engine, reaching the manager's services over the lab's links. The portal reaches each
GPU host's engine over TCP with TLS both ways. Someone logs in through the public entry in Chromium, starts a
notebook session that the allocator puts on a GPU host, opens its JupyterLab and stops it; its minutes are
charged once to its end. Then the lab goes, leaving nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.conftest import ROOT
from tests.deploy.deployment import DOCKER, Deployment, build_images, run
from tests.deploy.test_smoke import (
    add_credit,
    charged_exactly,
    log_in,
    open_jupyterlab,
    start_a_notebook,
    stop_a_notebook,
)
from tests.lab import certificates
from tests.lab.fleet import devices, fleet_spec
from tests.lab.lab import ENGINE_TLS_PORT, Lab, Node

pytestmark = [pytest.mark.docker, pytest.mark.deploy, pytest.mark.lab, pytest.mark.timeout(1800)]
LAB = "gpls"
IMAGES = [f"gpu-portal/{name}:latest" for name in ("portal", "hub", "postgres", "redis", "notebook")]
MANAGER_SERVICES = ["postgres", "redis", "web", "worker", "estimate", "beat", "hub", "proxy"]
GPU_HOST_SERVICES = ["agent", "render", "fence"]
# The GPU hosts' share of the lab's fleet; the manager has no GPUs here (no agent: nothing placed there).
FLEET = "; ".join(part for part in fleet_spec(LAB).split("; ") if not part.startswith(f"{LAB}-n1:"))

HOSTS = """
import json
from sessions.gpus.models import GpuHost
from sessions.notebooks.models import NotebookSession
print(json.dumps({
    "hosts": {h.name: [h.state, h.node_id] for h in GpuHost.objects.order_by("name")},
    "sessions": [[s.server_name, s.slice.gpu.host.name, s.slice.device_uuid]
                 for s in NotebookSession.objects.select_related("slice__gpu__host") if s.slice],
}))
"""


class HostsDeployment(Deployment):
    """The stack on the lab's Swarm: every `docker` of the base class goes to the manager's engine
    (DOCKER_HOST, set by the test), the GPU hosts' programs are looked at on their own engines."""

    lab: Lab

    def up(self) -> None:
        for node in self.lab.nodes[1:]:
            self.lab.manager.docker("node", "update", "--label-add", "gpu-portal.gpu-host=true", node.name)
        self.deploy()

    def deploy(self) -> str:
        stack = [str(ROOT / "compose/bin/stack"), str(self.env_file), "deploy", self.name]
        return run(*stack, str(ROOT / "compose/swarm-hosts.yaml"), timeout=300)

    def health(self) -> dict[str, str]:
        found = {}
        for service in MANAGER_SERVICES:
            found[service] = self._health(self.lab.manager, service)
        for node in self.lab.nodes[1:]:
            for service in GPU_HOST_SERVICES:
                found[f"{service}@{node.name}"] = self._health(node, service)
        return found

    def _health(self, node: Node, service: str) -> str:
        label = f"label=com.docker.swarm.service.name={self.name}_{service}"
        ids = node.docker("ps", "-q", "--filter", label).split()
        states = [node.docker("inspect", "--format", "{{.State.Health.Status}}", one).strip() for one in ids]
        return ",".join(states)

    def logs(self, service: str) -> str:
        name = f"{self.name}_{service.split('@')[0]}"
        return self.lab.manager.docker("service", "logs", "--tail", "30", name, check=False, timeout=30)


def notebooks_on(node: Node) -> list[str]:
    """The NVIDIA_VISIBLE_DEVICES of each notebook server running on the node's engine."""
    found = []
    for container in node.docker("ps", "-q", "--filter", "ancestor=gpu-portal/notebook:latest").split():
        env = node.docker("inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", container).split()
        found += [line.split("=", 1)[1] for line in env if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
    return found


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    build_images()
    folder = Path("/var/lib/gpu-portal-lab") / LAB
    built = Lab(LAB, devices=devices(FLEET))
    built.down()
    tls = certificates.make(folder.parent / f"{LAB}-tls", built.nodes)
    built.tls = tls.parent
    try:
        built.up(images=IMAGES)
        for node in built.nodes:  # the stack names each node's engine socket by its hostname (a Swarm template)
            (built.folder / node.name).symlink_to(node.folder, target_is_directory=True)
        yield built
    finally:
        built.down()
        shutil.rmtree(tls.parent, ignore_errors=True)
    assert not built.leftovers(), built.leftovers()


def relay_in(lab: Lab, port: int) -> subprocess.Popen[bytes]:
    """This machine's 127.0.0.1:port carried to the manager's own 127.0.0.1:port, where its public entry
    listens: the one address people meet."""
    pidfile = lab.folder / "public-relay.pid"
    command = [sys.executable, "-m", "tests.lab.relay", lab.manager.netns, lab.manager.address]
    command += [f"--into={port}:{port}", f"--pidfile={pidfile}"]
    log = (lab.folder / "public-relay.log").open("ab")
    relay = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 10
    while not pidfile.exists():
        assert relay.poll() is None and time.monotonic() < deadline, (lab.folder / "public-relay.log").read_text()
        time.sleep(0.05)
    return relay


def test_the_stack_over_three_hosts_runs_a_session_on_a_gpu_host_with_tls_to_its_engine(
    lab: Lab, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", lab.manager.endpoint)
    assert lab.tls is not None
    client_tls = lab.tls / "client"
    gpu_hosts = lab.nodes[1:]
    engines = "; ".join(f"{node.name}=tcp://{node.address}:{ENGINE_TLS_PORT}" for node in gpu_hosts)
    deployment = HostsDeployment("swarm-hosts", name="gpls" + os.urandom(3).hex())
    deployment.lab = lab
    port = deployment.port  # the public entry's, on this machine and inside the manager
    scratch = deployment.folder / "scratch"
    run("install", "-d", "-o", "10001", "-g", "10001", str(scratch))
    deployment.settings.update(
        PORTAL_MANAGER_ADDRESS=lab.manager.address,
        PORTAL_DOCKER_ENGINES=engines,
        PORTAL_DOCKER_TLS_FILES=str(client_tls),
        PORTAL_DOCKER_SOCKET=f"{lab.folder}/{{{{.Node.Hostname}}}}/docker.sock",
        PORTAL_SIMULATED_FLEET=FLEET,
        PORTAL_RENDER_SCRATCH_DIR=str(scratch),
    )
    deployment.env_file.write_text("".join(f"{key}={value}\n" for key, value in deployment.settings.items()))

    # An engine's TCP port answers no one without a certificate from the lab's CA.
    bare = run(
        "nsenter", f"--net=/run/netns/{lab.manager.netns}", "--",
        DOCKER, "-H", f"tcp://{gpu_hosts[0].address}:{ENGINE_TLS_PORT}", "version", check=False, timeout=30,
    )  # fmt: skip
    assert "Server:" not in bare, bare

    relay = relay_in(lab, port)
    try:
        deployment.up()
        deployment.wait_healthy(timeout=480)
        placed = deployment.python(HOSTS)
        listed = lab.manager.docker("node", "ls", "--format", "{{.Hostname}} {{.ID}}").splitlines()
        nodes = dict(line.split() for line in listed)
        # Each GPU host's agent beats with its Swarm node's id; the manager, with no GPUs, has none.
        assert placed["hosts"] == {node.name: ["up", nodes[node.name]] for node in gpu_hosts}, placed

        log_in(page, deployment)
        add_credit(page, deployment)
        name = "on-a-gpu-host"
        start_a_notebook(page, deployment, name)  # the first MIG offer: the A100 of n2
        ((server, host, device),) = deployment.python(HOSTS)["sessions"]
        assert (server, host) == (name, gpu_hosts[0].name)
        # Its server runs on that host's engine alone, given its slice's device as NVIDIA's runtime expects.
        assert (notebooks_on(gpu_hosts[0]), notebooks_on(gpu_hosts[1])) == ([device], [])
        open_jupyterlab(page, deployment, name)
        stop_a_notebook(page, deployment, name)
        charged_exactly(deployment, name)
        # Gone from its host once stopped: the end read from that host's engine, over TLS.
        assert notebooks_on(gpu_hosts[0]) == []
    finally:
        run(DOCKER, "stack", "rm", deployment.name, check=False)
        relay.terminate()
        relay.wait(10)
        shutil.rmtree(deployment.folder, ignore_errors=True)
