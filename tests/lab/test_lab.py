"""The lab itself (issue 32, item 1): three hosts, each its own engine and host name in one Swarm; each host's
NVIDIA stand-in refuses another host's GPU; a cut link is seen by the Swarm and mends; tear-down leaves
nothing on the machine."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from sessions.gpus.models import GpuHost
from sessions.runtime import swarm
from tests.gpus.conftest import use_fleet
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


def swarm_of(name: str) -> tuple[str, str]:
    swarm.watch()  # what beat does every ten seconds
    host = GpuHost.objects.get(name=name)
    return host.swarm_state, host.swarm_availability


@pytest.mark.django_db
def test_a_cut_link_is_seen_by_the_swarm_and_on_the_fleet_page_and_mends(
    lab: Lab,
    staff: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.SWARM_MANAGER = lab.manager.endpoint
    use_fleet(settings, f"{fleet_spec(lab.name)}; {lab.name}-n9: 1xL4:whole")  # n9: a machine not in the Swarm
    assert all(swarm_of(node.name) == ("ready", "active") for node in lab.nodes)
    node_ids = {host.name: host.swarm_node for host in GpuHost.objects.all()}
    assert node_ids[f"{lab.name}-n9"] == "" and len({node_ids[node.name] for node in lab.nodes}) == 3
    third = lab.nodes[2]
    lab.cut(third)
    try:
        wait_for(lambda: lab.swarm_nodes().get(third.name) == "Down", 60, f"the Swarm to see {third.name} down")
        wait_for(lambda: swarm_of(third.name)[0] == "down", 30, "the fleet's record of it")
        client = Client()
        client.force_login(staff)
        page = client.get(reverse("fleet")).content.decode()
        assert "down, active" in page and "ready, active" in page and "not in the Swarm" in page
    finally:
        lab.mend(third)
    wait_for(lambda: lab.swarm_nodes().get(third.name) == "Ready", 60, f"{third.name} back in the Swarm")
    wait_for(lambda: swarm_of(third.name) == ("ready", "active"), 30, "the fleet's record of it back")


def test_tear_down_leaves_nothing(docker_engine: str) -> None:
    scratch = Lab("gplx", size=2, devices=devices(fleet_spec("gplx")))
    scratch.down()
    scratch.up(images=[BUSYBOX])
    service(scratch, scratch.nodes[1], sorted(scratch.devices[scratch.nodes[1].name])[0])
    wait_for(lambda: "running" in scratch.nodes[1].docker("ps", "--format", "{{.State}}"), 30, "a container running")
    assert scratch.leftovers()  # the check sees a lab that is up
    scratch.down()
    assert scratch.leftovers() == []
