"""Each lab host runs its own GPU agent inside its namespace (issue 32, item 1), reaching the portal's database
and Redis over its link: the hosts beat, each for itself; a host whose agent is killed is lost, and is back
once the agent is started again. (A host whose link is cut: test_lab_notebooks, with a session running there.)"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from portal.clock import database_now
from sessions.gpus import hosts
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate, release
from sessions.gpus.models import GpuHost, Slice
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.waiting import wait_for
from tests.lab import invariants
from tests.lab.fleet import fleet_spec
from tests.lab.hosts import running_agents, start_agent
from tests.lab.lab import Lab

pytestmark = [
    pytest.mark.docker,
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(processes.test_database_url().startswith("sqlite"), reason="the lab hosts reach PostgreSQL"),
]
HEARTBEAT_S = 1


@pytest.fixture
def agents(lab: Lab, prices: None, settings) -> Iterator[dict[str, subprocess.Popen[bytes]]]:  # type: ignore[no-untyped-def]
    settings.HOST_HEARTBEAT_S, settings.HOST_LOST_AFTER_S = HEARTBEAT_S, 3 * HEARTBEAT_S
    use_fleet(settings, fleet_spec(lab.name))
    with running_agents(lab, HEARTBEAT_S) as started:
        yield started


def beating(name: str) -> bool:
    host = GpuHost.objects.get(name=name)
    recent = host.heartbeat_at is not None and database_now() - host.heartbeat_at < timedelta(seconds=2)
    return recent and host.state == GpuHost.State.UP


def lost(name: str) -> bool:
    hosts.watch()  # what beat does every few seconds
    return GpuHost.objects.get(name=name).state == GpuHost.State.LOST


def test_a_killed_agent_loses_its_host_no_slice_goes_there_and_it_is_back_when_the_agent_restarts(
    lab: Lab, agents: dict[str, subprocess.Popen[bytes]], alice: User
) -> None:
    """The agent of the second host is killed (SIGKILL: no goodbye): its host is lost within the bound, its
    L4 is refused with the reason while the other host's is given, and once its supervisor starts the agent
    again the host is up and its L4 is given again; the invariants hold throughout."""
    second = lab.nodes[1]
    wait_for(lambda: all(beating(node.name) for node in lab.nodes), 60, "every lab host's agent to beat")
    # Each beats for itself, from its own namespace: the node it names is its host's.
    assert {GpuHost.objects.get(name=node.name).node_id for node in lab.nodes} == {node.name for node in lab.nodes}
    agents[second.name].kill()
    agents[second.name].wait(10)
    wait_for(lambda: lost(second.name), 30, f"{second.name} to be lost")
    with pytest.raises(AllocationRefused, match="lost"):
        allocate(alice, SliceRequest("whole", model="L4", host=second.name))
    elsewhere = allocate(alice, SliceRequest("whole", model="L4"))
    assert elsewhere.gpu.host.name == lab.nodes[2].name, "the L4 of a host that is up"
    invariants.check(lab)

    agents[second.name] = start_agent(lab, second, HEARTBEAT_S)  # as its supervisor would
    wait_for(lambda: beating(second.name), 60, f"{second.name} to beat again")
    hosts.watch()
    assert allocate(alice, SliceRequest("whole", model="L4", host=second.name)).gpu.host.name == second.name
    for held in Slice.objects.filter(released_at__isnull=True).values_list("pk", flat=True):
        release(held, "test over")
    invariants.check(lab)
