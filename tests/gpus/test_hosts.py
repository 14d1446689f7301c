"""GPU hosts have a heartbeat and a state (issue 31, item 2): the agent beats, the watch finds a silent host
lost, an operator drains one and brings it back, and the allocator places only on hosts that are up. Two
machines beating for one host, or two hosts claiming one GPU, are refused and flagged; nothing moves."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client
from django.urls import reverse

from portal.clock import database_now
from sessions.gpus import hosts
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.hosts import HostRefused, Node
from sessions.gpus.models import Gpu, GpuHost, Slice
from sessions.metrics.agent import Agent
from tests.gpus.conftest import FleetMaker, use_fleet

pytestmark = pytest.mark.django_db
MIG = SliceRequest("mig", "1g.18gb")
HERE, THERE = Node("machine-a", 16, 65536), Node("machine-b", 8, 32768)


def silent_for(name: str, seconds: float) -> None:
    """The host's agent last beat ``seconds`` ago."""
    GpuHost.objects.filter(name=name).update(heartbeat_at=database_now() - timedelta(seconds=seconds))


def host(name: str) -> GpuHost:
    return GpuHost.objects.get(name=name)


def test_a_heartbeat_records_the_machine_and_its_size_with_the_database_s_clock(make_fleet: FleetMaker) -> None:
    make_fleet("sim-1: 1xH200:mig")
    assert host("sim-1").heartbeat_at is None  # discovery alone is no agent
    before = database_now()
    hosts.heartbeat("sim-1", "simulated", HERE)
    beat = host("sim-1")
    assert (beat.node_id, beat.cpus, beat.memory_mib, beat.state) == ("machine-a", 16, 65536, GpuHost.State.UP)
    assert beat.heartbeat_at is not None and beat.heartbeat_at >= before


def test_a_second_machine_beating_for_a_host_is_refused_and_flagged_until_the_first_goes_silent(
    make_fleet: FleetMaker, settings
) -> None:  # type: ignore[no-untyped-def]
    make_fleet("sim-1: 1xH200:mig")
    hosts.heartbeat("sim-1", "simulated", HERE)
    with pytest.raises(HostRefused, match="Two machines beat for this host: machine-a .* machine-b"):
        hosts.heartbeat("sim-1", "simulated", THERE)
    flagged = host("sim-1")
    assert flagged.node_id == "machine-a" and "machine-b (refused)" in flagged.problem
    silent_for("sim-1", settings.HOST_LOST_AFTER_S + 1)
    hosts.heartbeat("sim-1", "simulated", THERE)  # the first is gone: the machine was replaced
    taken = host("sim-1")
    assert (taken.node_id, taken.cpus, taken.problem) == ("machine-b", 8, "")


def test_a_silent_host_is_lost_past_the_bound_and_up_again_when_its_agent_beats(
    make_fleet: FleetMaker, settings
) -> None:  # type: ignore[no-untyped-def]
    make_fleet("sim-1: 1xH200:mig; sim-2: 1xH200:mig")
    hosts.heartbeat("sim-1", "simulated", HERE)
    hosts.heartbeat("sim-2", "simulated", THERE)
    silent_for("sim-1", settings.HOST_LOST_AFTER_S - 2)
    assert hosts.watch() == {"lost": [], "given_up": []}
    silent_for("sim-1", settings.HOST_LOST_AFTER_S + 1)
    assert hosts.watch() == {"lost": ["sim-1"], "given_up": []}
    lost = host("sim-1")
    assert lost.state == GpuHost.State.LOST and lost.state_reason.startswith("No heartbeat from its agent since")
    assert host("sim-2").state == GpuHost.State.UP
    assert hosts.watch()["lost"] == []  # once
    hosts.heartbeat("sim-1", "simulated", HERE)
    assert (host("sim-1").state, host("sim-1").state_reason) == (GpuHost.State.UP, "")


def test_no_slice_is_placed_on_a_lost_host(make_fleet: FleetMaker, alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    make_fleet("sim-1: 1xH200:mig; sim-2: 1xH200:mig")
    for name in ("sim-1", "sim-2"):
        hosts.heartbeat(name, "simulated", HERE if name == "sim-1" else THERE)
    silent_for("sim-1", settings.HOST_LOST_AFTER_S + 1)
    hosts.watch()
    for _ in range(3):
        assert allocate(alice, MIG).gpu.host.name == "sim-2"
    silent_for("sim-2", settings.HOST_LOST_AFTER_S + 1)
    hosts.watch()
    with pytest.raises(AllocationRefused, match="Every GPU host with a MIG GPU with 1g.18gb is lost") as refused:
        allocate(alice, MIG)
    assert refused.value.code == "hosts_away"


def test_a_drained_host_gets_no_new_slice_and_its_running_ones_run_on(
    make_fleet: FleetMaker, alice: User, staff: User
) -> None:
    make_fleet("sim-1: 1xH200:mig, 1xL4:whole")
    running = allocate(alice, MIG)
    drained = hosts.drain(host("sim-1").pk, staff)
    assert drained.state == GpuHost.State.DRAINING and drained.state_reason.startswith(
        f"Drained by {staff.username} at"
    )
    for request, what in ((MIG, "a MIG GPU with 1g.18gb"), (SliceRequest("whole"), "a whole GPU")):
        with pytest.raises(AllocationRefused, match=f"Every GPU host with {what} is draining"):
            allocate(alice, request)
    assert Slice.objects.get(pk=running.pk).released_at is None
    with pytest.raises(HostRefused, match="already drained"):
        hosts.drain(host("sim-1").pk, staff)
    hosts.resume(host("sim-1").pk, staff)
    assert host("sim-1").state == GpuHost.State.UP
    assert allocate(alice, MIG).gpu.host.name == "sim-1"
    with pytest.raises(HostRefused, match="is not drained"):
        hosts.resume(host("sim-1").pk, staff)


def test_a_drained_host_lost_and_back_is_still_drained(make_fleet: FleetMaker, staff: User, settings) -> None:  # type: ignore[no-untyped-def]
    make_fleet("sim-1: 1xH200:mig")
    hosts.heartbeat("sim-1", "simulated", HERE)
    hosts.drain(host("sim-1").pk, staff)
    silent_for("sim-1", settings.HOST_LOST_AFTER_S + 1)
    hosts.watch()
    assert host("sim-1").state == GpuHost.State.LOST
    hosts.heartbeat("sim-1", "simulated", HERE)
    back = host("sim-1")
    assert back.state == GpuHost.State.DRAINING and back.state_reason == back.drained != ""
    hosts.resume(back.pk, staff)
    assert host("sim-1").state == GpuHost.State.UP


def test_two_hosts_claiming_one_gpu_uuid_the_second_is_refused_and_flagged_and_nothing_moves(
    settings, alice: User
) -> None:  # type: ignore[no-untyped-def]
    """A copied configuration: sim-2 reports a GPU whose UUID another host reported first. The GPU stays with
    the first host, its slice with it; sim-2 is flagged on the fleet page."""
    [first] = use_fleet(settings, "sim-2: 1xH200:mig")  # the UUID is derived from sim-2's spec ...
    other = GpuHost.objects.create(name="first", backend="simulated")
    Gpu.objects.filter(pk=first.pk).update(host=other)  # ... and recorded on another host first
    held = allocate(alice, MIG)
    use_fleet(settings, "sim-2: 1xH200:mig")
    gpu = Gpu.objects.get(pk=first.pk)
    assert gpu.host == other and Gpu.objects.filter(uuid=first.uuid).count() == 1
    assert Slice.objects.get(pk=held.pk).gpu_id == gpu.pk
    flagged = host("sim-2")
    assert f"reports UUID {first.uuid}, which first has" in flagged.problem and "nothing moved" in flagged.problem
    assert not flagged.gpus.exists()


def test_the_fleet_page_shows_each_host_s_state_and_heartbeat_and_staff_drain_and_resume(
    make_fleet: FleetMaker, staff: User, alice: User
) -> None:
    make_fleet("sim-1: 1xH200:mig")
    hosts.heartbeat("sim-1", "simulated", HERE)
    client = Client()
    client.force_login(staff)
    page = client.get(reverse("fleet")).content.decode()
    assert 'data-host-state="up"' in page and "machine-a" in page and "16 CPUs, 64 GiB" in page
    target = reverse("fleet-host-drain", kwargs={"host_id": host("sim-1").pk})
    answer = client.post(target, {"action": "drain"}, follow=True).content.decode()
    assert 'data-host-state="draining"' in answer and "sim-1 is draining" in answer
    assert "Take new work again" in answer
    answer = client.post(target, {"action": "drain"}, follow=True).content.decode()
    assert "already drained" in answer
    assert "takes new work again" in client.post(target, {"action": "resume"}, follow=True).content.decode()
    assert "Say drain or resume" in client.post(target, {"action": "reboot"}, follow=True).content.decode()
    someone = Client()
    someone.force_login(alice)
    assert someone.post(target, {"action": "drain"}).status_code in (302, 403)
    assert host("sim-1").state == GpuHost.State.UP


@pytest.mark.django_db(transaction=True)  # the agent's database thread has a connection of its own
def test_the_agent_beats_for_each_host_it_serves(make_fleet: FleetMaker, settings) -> None:  # type: ignore[no-untyped-def]
    make_fleet("sim-1: 1xH200:mig; sim-2: 1xL4:whole")
    settings.HOST_HEARTBEAT_S = 1
    GpuHost.objects.update(heartbeat_at=None)
    agent = Agent(get_backend(), "simulated", 0.1, beats_for=["sim-1", "sim-2"])
    asyncio.run(agent.run(ticks=2))
    beaten = GpuHost.objects.filter(heartbeat_at__isnull=False, node_id=hosts.node_identity())
    assert sorted(beaten.values_list("name", flat=True)) == ["sim-1", "sim-2"]
    assert all(beat.cpus and beat.memory_mib for beat in beaten)


def test_a_host_s_heartbeat_age_and_state_are_in_metrics(make_fleet: FleetMaker, settings) -> None:  # type: ignore[no-untyped-def]
    make_fleet("sim-1: 1xH200:mig")
    settings.METRICS_TOKEN = "token-for-tests"
    hosts.heartbeat("sim-1", "simulated", HERE)
    GpuHost.objects.update(heartbeat_at=F("heartbeat_at") - timedelta(seconds=12))
    text = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer token-for-tests").content.decode()
    assert 'portal_gpu_host_state{host="sim-1",state="up"} 1.0' in text
    assert 'portal_gpu_host_state{host="sim-1",state="lost"} 0.0' in text
    [age] = [
        line for line in text.splitlines() if line.startswith('portal_gpu_host_heartbeat_age_seconds{host="sim-1"}')
    ]
    assert 12 <= float(age.split()[-1]) < 60


def test_a_swarm_node_simulates_only_its_own_hosts_of_the_fleet(settings) -> None:  # type: ignore[no-untyped-def]
    """Each GPU host of a Swarm stack gets the whole fleet and its own name (PORTAL_SIMULATED_HOSTS): its agent
    finds, beats for and may change that host's GPUs alone, so two nodes' agents never claim one host."""
    from sessions.gpus import agency
    from sessions.gpus.backends import BackendError
    from sessions.gpus.backends.simulated import SimulatedBackend

    spec = "n1: 1xH200:mig; n2: 2xL4:whole; n3: 1xA30:shared=2"
    settings.GPU_BACKEND, settings.SIMULATED_FLEET, settings.SIMULATED_HOSTS = "simulated", spec, ["n2"]
    get_backend.cache_clear()
    try:
        assert agency.hosts_of_this_machine() == ["n2"]
        found = [(host.name, [gpu.model_name for gpu in host.gpus]) for host in get_backend().discover()]
        assert found == [("n2", ["L4-24GB", "L4-24GB"])]
        settings.SIMULATED_HOSTS = []
        assert agency.hosts_of_this_machine() == ["n1", "n2", "n3"]
    finally:
        get_backend.cache_clear()
    with pytest.raises(BackendError, match="PORTAL_SIMULATED_HOSTS names n4, which PORTAL_SIMULATED_FLEET"):
        SimulatedBackend(spec, hosts=["n2", "n4"])


def test_an_operator_drains_and_brings_back_a_host_from_a_shell(
    make_fleet: FleetMaker, staff: User, alice: User
) -> None:
    """`manage.py drain_host` does what the fleet page's button does, for the staff member named, and says how
    many slices still run there; a wrong host or person is refused with the reason, changing nothing."""
    from io import StringIO

    from django.core.management import CommandError, call_command

    make_fleet("sim-1: 1xH200:mig; sim-2: 1xL4:whole")
    allocate(alice, MIG)
    out = StringIO()
    call_command("drain_host", "sim-1", f"--by={staff.username}", stdout=out)
    assert host("sim-1").state == GpuHost.State.DRAINING
    assert f"Drained by {staff.username}" in out.getvalue() and "Slices still held there: 1." in out.getvalue()
    with pytest.raises(CommandError, match="already drained"):
        call_command("drain_host", "sim-1", f"--by={staff.username}")
    with pytest.raises(CommandError, match=r"no GPU host is named 'sim-9' \(the hosts: sim-1, sim-2\)"):
        call_command("drain_host", "sim-9", f"--by={staff.username}")
    with pytest.raises(CommandError, match="'alice' is not an active staff member"):
        call_command("drain_host", "sim-2", "--by=alice")
    assert host("sim-2").state == GpuHost.State.UP
    call_command("drain_host", "sim-1", "--undo", f"--by={staff.username}", stdout=out)
    assert host("sim-1").state == GpuHost.State.UP and "sim-1 takes new work again" in out.getvalue()
