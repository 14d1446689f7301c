"""What a user container may take of its host, on the real Docker engine: its log on the host's disk is
rotated (the spec's log limits, from PORTAL_CONTAINER_LOG_MAX_BYTES and PORTAL_CONTAINER_LOG_FILES), and its
memory limit is never more than the host can give, whatever its slice's share would be. Both launch paths
apply the same spec (``ContainerSpec.host_config``): the render sandbox through the Docker adapter, notebooks
through the hub's spawner (tests/sessions_runtime/test_spec.py shows it receives exactly that spec)."""

from __future__ import annotations

import glob
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.slices import spec_for
from tests.gpus.conftest import use_fleet

pytestmark = [pytest.mark.docker, pytest.mark.django_db]
BUSYBOX = "gpu-portal/busybox:latest"
MIB = 1024**2


@pytest.fixture
def whole_gpu(settings, alice: User, docker_engine: str) -> Iterator[Slice]:  # type: ignore[no-untyped-def]
    use_fleet(settings, "bounds: 1xH200:whole")
    yield allocate(alice, SliceRequest("whole", "", "H200"), holder=Holder.render(8))
    get_backend.cache_clear()


@pytest.fixture
def runtime(whole_gpu: Slice) -> Iterator[DockerRuntime]:
    """The Docker adapter; the containers it started on the slice (found by their label) go afterwards."""
    made = DockerRuntime()
    yield made
    for container_id in made.containers_for("slice", str(whole_gpu.pk)):
        made.remove(container_id)


def test_a_containers_log_on_the_hosts_disk_is_rotated_at_its_limit(
    whole_gpu: Slice,
    runtime: DockerRuntime,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.CONTAINER_LOG_MAX_BYTES, settings.CONTAINER_LOG_FILES = MIB, 2
    spec = spec_for(whole_gpu, BUSYBOX)
    # 6 MB of output, in lines of 100 bytes.
    container_id = runtime.start(
        spec,
        [
            "sh",
            "-c",
            "yes 0123456789012345678901234567890123456789"
            "0123456789012345678901234567890123456789012345678 | head -c 6000000",
        ],
    )
    assert runtime.wait(container_id, timeout=60) == 0
    attrs = runtime.client.containers.get(container_id).attrs
    assert attrs["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": {"max-size": str(MIB), "max-file": "2"}}
    on_disk = sum(Path(path).stat().st_size for path in glob.glob(attrs["LogPath"] + "*"))
    assert 0 < on_disk <= 2 * MIB + 4096, f"{on_disk} bytes of log on the host"


def test_a_containers_memory_limit_is_never_more_than_its_host_can_give(
    whole_gpu: Slice, runtime: DockerRuntime
) -> None:
    """A whole H200 (141 GiB) at a GiB of host memory per GiB of GPU memory asks for more than this host has."""
    spec = spec_for(whole_gpu, BUSYBOX)
    host_memory = int(runtime.client.info()["MemTotal"])
    assert spec.limits.memory_bytes > host_memory, "the slice's share alone would be more than the host has"

    container_id = runtime.start(spec, ["true"])

    limit = int(runtime.client.containers.get(container_id).attrs["HostConfig"]["Memory"])
    assert 0 < limit <= host_memory * 3 // 4, f"{limit} bytes of {host_memory}: the host keeps a quarter"
