"""One container spec, built once per container: what both launch paths apply."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.holders import Holder
from sessions.notebooks.models import NotebookImage
from sessions.notebooks.services import Launch, start_session
from sessions.runtime.slices import spec_for
from sessions.runtime.spec import NO_IPV6, ContainerSpec
from tests.gpus.conftest import FleetMaker, use_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def make_fleet(settings) -> Iterator[FleetMaker]:  # type: ignore[no-untyped-def]
    yield lambda spec: use_fleet(settings, spec)
    get_backend.cache_clear()


def test_a_batch_container_gets_no_network_and_the_hardening(make_fleet: FleetMaker, alice: User) -> None:
    make_fleet("spec: 1xH200:mig")
    taken = allocate(alice, SliceRequest("mig", "3g.71gb"), holder=Holder.render(4))
    spec = spec_for(taken, "gpu-portal/busybox:latest", host_cpus=64)
    config = spec.host_config()
    assert config["network_mode"] == "none"
    assert "sysctls" not in config  # a namespace without interfaces has no IPv6 to switch off
    assert config["security_opt"] == ["no-new-privileges:true"] and config["cap_drop"] == ["ALL"]
    assert config["auto_remove"] is False
    assert config["device_requests"] == [
        {"driver": "nvidia", "device_ids": [taken.device_uuid], "capabilities": [["gpu"]]}
    ]
    assert config["nano_cpus"] == 6 * 10**9 and config["pids_limit"] == settings.CONTAINER_PIDS_LIMIT
    assert config["mem_limit"] == int(taken.memory_gib * settings.HOST_MEMORY_PER_GPU_GIB * 1024**3)
    assert spec.labels["gpu-portal.instance"] == settings.INSTANCE_ID
    assert spec.labels["gpu-portal.slice"] == str(taken.pk) and spec.labels["gpu-portal.holder"] == "render:4"


def test_a_container_on_a_bridge_has_ipv6_off_and_one_on_the_host_network_has_no_net_sysctls(
    make_fleet: FleetMaker, alice: User
) -> None:
    make_fleet("spec: 1xL4:whole")
    taken = allocate(alice, SliceRequest("whole"))
    assert spec_for(taken, "img", network="gpu-portal").host_config()["sysctls"] == NO_IPV6
    assert "sysctls" not in spec_for(taken, "img", network="host").host_config()


def test_no_container_asks_for_more_cpus_than_its_host_has(make_fleet: FleetMaker, alice: User) -> None:
    make_fleet("spec: 1xH200:mig")
    taken = allocate(alice, SliceRequest("mig", "7g.141gb"))
    assert spec_for(taken, "img").limits.cpus == 14
    assert spec_for(taken, "img", host_cpus=4).limits.cpus == 4
    assert spec_for(taken, "img").within_host(3).host_config()["nano_cpus"] == 3 * 10**9


def test_the_spawner_receives_exactly_the_spec_the_portal_built(notebook_image: NotebookImage, alice: User) -> None:
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "lab"))
    assert session.slice is not None
    client = Client(HTTP_AUTHORIZATION=f"Bearer {settings.HUB_SERVICE_TOKEN}")
    launch = client.get("/internal/notebooks/launch-spec", {"user": "alice", "server": "lab"}).json()
    received = ContainerSpec.from_json(launch["container"])
    built = spec_for(
        session.slice,
        notebook_image.image,
        network=settings.USER_NETWORK.name,
        labels={"gpu-portal.session": str(session.pk)},
    )
    assert received == built
    assert received.host_config() == built.host_config()
    assert received.host_config()["sysctls"] == NO_IPV6


@pytest.mark.parametrize(
    "broken",
    [{}, {"image": "x", "device_ids": [], "cpus": "many", "mem_bytes": 1, "pids": 1, "labels": {}, "network": "n"}],
)
def test_a_spec_that_is_not_one_is_refused(broken: dict[str, object]) -> None:
    with pytest.raises((KeyError, TypeError, ValueError)):
        ContainerSpec.from_json(broken)


def test_the_log_limits_reach_the_spawner_with_the_rest_of_the_spec(
    make_fleet: FleetMaker,
    alice: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.CONTAINER_LOG_MAX_BYTES, settings.CONTAINER_LOG_FILES = 5 * 1024**2, 7
    make_fleet("spec: 1xH200:mig")
    spec = spec_for(allocate(alice, SliceRequest("mig", "1g.18gb")), "img")
    log_config = {"type": "json-file", "config": {"max-size": str(5 * 1024**2), "max-file": "7"}}
    assert spec.host_config()["log_config"] == log_config
    assert ContainerSpec.from_json(spec.to_json()).host_config()["log_config"] == log_config
