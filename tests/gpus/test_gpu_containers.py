"""A real container started for a slice receives exactly that slice's device, and its limits and labels."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.slices import limits_for
from tests.gpus.conftest import FleetMaker
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.docker
IMAGE = "gpu-portal/busybox:latest"
SHOW_DEVICES = ["sh", "-c", "env | grep ^NVIDIA_ | sort"]


@pytest.fixture
def runtime(docker_engine: str) -> Iterator[DockerRuntime]:
    runtime = DockerRuntime()
    started: list[str] = []
    runtime.started = started  # type: ignore[attr-defined]
    yield runtime
    for container_id in started:
        runtime.remove(container_id)


def run_on(runtime: DockerRuntime, taken: Slice) -> tuple[str, str]:
    return run_on_with(runtime, taken, SHOW_DEVICES)


def run_on_with(runtime: DockerRuntime, taken: Slice, command: list[str]) -> tuple[str, str]:
    container_id = runtime.start_for_slice(taken, IMAGE, command=command)
    runtime.started.append(container_id)  # type: ignore[attr-defined]
    assert runtime.wait(container_id, timeout=60) == 0
    return container_id, runtime.logs(container_id)


def test_a_mig_slice_container_sees_its_own_uuid_and_nothing_else(
    make_fleet: FleetMaker, many_slices: User, runtime: DockerRuntime
) -> None:
    make_fleet("dock: 1xH200:mig")
    mine = allocate(many_slices, SliceRequest(kind="mig", profile="2g.35gb"), holder=Holder.notebook(7))
    other = allocate(many_slices, SliceRequest(kind="mig", profile="1g.18gb"))
    _, output = run_on(runtime, mine)
    assert output.splitlines() == [f"NVIDIA_VISIBLE_DEVICES={mine.device_uuid}"]
    assert other.device_uuid not in output


def test_a_whole_gpu_container_sees_the_gpus_uuid(make_fleet: FleetMaker, alice: User, runtime: DockerRuntime) -> None:
    gpu = make_fleet("dock: 1xL4:whole")[0]
    taken = allocate(alice, SliceRequest(kind="whole"))
    _, output = run_on(runtime, taken)
    assert output.splitlines() == [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]


def test_gpu_containers_carry_limits_labels_and_no_new_privileges(
    make_fleet: FleetMaker, alice: User, runtime: DockerRuntime
) -> None:
    make_fleet("dock: 1xH200:mig")
    taken = allocate(alice, SliceRequest(kind="mig", profile="3g.71gb"), holder=Holder.render(3))
    container_id, _ = run_on(runtime, taken)
    attrs = runtime.client.containers.get(container_id).attrs
    host = attrs["HostConfig"]
    limits = limits_for(taken, runtime.host_cpus()).at_most(runtime.host_cpus(), runtime.host_memory())
    assert host["NanoCpus"] == int(limits.cpus * 1e9) == min(6, runtime.host_cpus()) * 10**9
    assert host["Memory"] == limits.memory_bytes
    assert host["PidsLimit"] == limits.pids
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert host["DeviceRequests"][0]["DeviceIDs"] == [taken.device_uuid]
    assert host["DeviceRequests"][0]["Driver"] == "nvidia"
    labels = attrs["Config"]["Labels"]
    assert labels["gpu-portal.slice"] == str(taken.pk)
    assert labels["gpu-portal.holder"] == "render:3"
    assert runtime.containers_for("slice", str(taken.pk)) == [container_id]


def test_a_busy_container_makes_its_simulated_slice_busy(
    make_fleet: FleetMaker, many_slices: User, runtime: DockerRuntime
) -> None:
    """The simulator follows what really runs: a container spinning a CPU shows a busy GPU instance."""
    from sessions.gpus.backends import get_backend
    from sessions.metrics.agent import Activity

    make_fleet("dock: 1xH200:mig")
    busy = allocate(many_slices, SliceRequest(kind="mig", profile="1g.18gb"), holder=Holder.notebook(1))
    idle = allocate(many_slices, SliceRequest(kind="mig", profile="1g.18gb"), holder=Holder.notebook(2))
    spin = ["sh", "-c", "while :; do :; done"]
    for taken, command in ((busy, spin), (idle, ["sleep", "60"])):
        started = runtime.start_for_slice(taken, IMAGE, command=command, nano_cpus=int(1e9))
        runtime.started.append(started)  # type: ignore[attr-defined]
    activity = Activity(runtime.cpu_by_device)
    activity.refresh()

    def read_busy() -> bool:
        """A reading over the time since the last one: the spinner's is high once it has run a while."""
        activity.refresh()
        return activity.busy.get(busy.device_uuid, 0.0) > 0.6

    wait_for(read_busy, 30, "the spinning container's CPU use to show")
    held = {busy.device_uuid: 0.0, idle.device_uuid: 0.0}
    assert activity.busy[idle.device_uuid] < 0.1, activity.busy  # the same reading: the sleeper is idle
    (gpu,) = get_backend().sample({**held, **activity.for_holders(held)})
    util = {device.uuid: device.utilization for device in gpu.devices}
    assert util[busy.device_uuid] is not None and util[busy.device_uuid] > 55  # type: ignore[operator]
    assert util[idle.device_uuid] is not None and util[idle.device_uuid] < 10  # type: ignore[operator]


def test_a_batch_container_for_a_slice_has_no_network_at_all(
    make_fleet: FleetMaker, alice: User, runtime: DockerRuntime
) -> None:
    """Render jobs and other batch work run uploaded, hostile files: no interface but loopback."""
    make_fleet("dock: 1xH200:mig")
    taken = allocate(alice, SliceRequest(kind="mig", profile="1g.18gb"), holder=Holder.render(1))
    container_id, output = run_on_with(runtime, taken, ["ls", "/sys/class/net"])
    assert output.split() == ["lo"]
    host = runtime.client.containers.get(container_id).attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
