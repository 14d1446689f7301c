"""The lab itself (issue 32, item 1): three hosts, each its own engine and host name in one Swarm; each host's
NVIDIA stand-in refuses another host's GPU; tear-down leaves nothing on the machine. (A cut link, seen by the
Swarm and on the fleet page: test_lab_notebooks, with a session running on the host.)"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.helpers.waiting import wait_for
from tests.lab.fleet import devices, fleet_spec
from tests.lab.lab import BUSYBOX, SUBNET, Lab, Node, run

pytestmark = [pytest.mark.docker, pytest.mark.lab]


def service(lab: Lab, on: Node, gpu: str) -> str:
    """A one-shot service pinned to ``on`` by node id, given ``gpu`` as a Swarm service is (its environment)."""
    name = f"probe-{uuid.uuid4().hex[:8]}"
    node_id = lab.manager.docker("node", "inspect", on.name, "--format", "{{.ID}}").strip()
    lab.manager.docker(
        "service", "create", "--detach", f"--name={name}", "--restart-condition=none",
        f"--constraint=node.id=={node_id}", f"--env=NVIDIA_VISIBLE_DEVICES={gpu}",
        BUSYBOX, "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES; sleep 60",
    )  # fmt: skip
    return name


def task(lab: Lab, name: str) -> dict[str, str]:
    listed = lab.manager.docker("service", "ps", name, "--no-trunc", "--format", "{{json .}}")
    rows = [json.loads(line) for line in listed.splitlines() if line.strip()]
    return rows[0] if rows else {}


def test_three_hosts_each_with_its_own_engine_and_name_in_one_swarm(lab: Lab) -> None:
    assert lab.swarm_nodes() == {node.name: "Ready" for node in lab.nodes}
    for node in lab.nodes:
        info = json.loads(node.docker("info", "--format", "{{json .}}"))
        assert info["Name"] == node.name and info["DefaultRuntime"] == "nvidia"
        assert info["DockerRootDir"] == str(node.folder / "data") and info["CgroupDriver"] == "cgroupfs"
        # No route out of the lab: the only networks a host knows are the lab's and its engine's own.
        routes = run("ip", "-n", node.netns, "-4", "route", "show")
        assert "default" not in routes and f"{SUBNET}.0/24" in routes
    # Nothing of the lab on this machine's side: no address of it, no route to it.
    assert SUBNET not in run("ip", "-4", "addr", "show") and SUBNET not in run("ip", "-4", "route", "show")


def test_a_container_runs_with_its_hosts_gpu_and_fails_loudly_with_another_hosts(lab: Lab) -> None:
    first, second = lab.nodes[0], lab.nodes[1]
    own_gpu = next(uuid for uuid in sorted(lab.devices[second.name]) if uuid.startswith("GPU-"))
    foreign_gpu = next(uuid for uuid in sorted(lab.devices[first.name]) if uuid.startswith("MIG-"))
    good, bad = service(lab, second, own_gpu), service(lab, second, foreign_gpu)
    wait_for(lambda: task(lab, good).get("CurrentState", "").startswith("Running"), 30, "the service to run")
    assert task(lab, good)["Node"] == second.name
    wait_for(lambda: task(lab, bad).get("CurrentState", "").startswith("Failed"), 30, "the foreign GPU's refusal")
    assert f"no such GPU on this host: {foreign_gpu}" in task(lab, bad)["Error"]
    for name in (good, bad):
        lab.manager.docker("service", "rm", name)


def test_tear_down_leaves_nothing(docker_engine: str) -> None:
    scratch = Lab("gplx", size=2, devices=devices(fleet_spec("gplx")))
    scratch.down()
    scratch.up(images=[BUSYBOX])
    service(scratch, scratch.nodes[1], sorted(scratch.devices[scratch.nodes[1].name])[0])
    wait_for(lambda: "running" in scratch.nodes[1].docker("ps", "--format", "{{.State}}"), 30, "a container running")
    assert scratch.leftovers()  # the check sees a lab that is up
    scratch.down()
    assert scratch.leftovers() == []
