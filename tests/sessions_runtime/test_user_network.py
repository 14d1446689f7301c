"""The user-container bridge and its firewall, probed from real containers.

The outside world is a network namespace of our own (tests/helpers/lab.py): a private address standing for
the host's LAN or a metadata service, and a documentation-range address standing for the internet.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from django.conf import settings

from sessions.notebooks.tasks import reconcile_sessions
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.firewall import Firewall
from sessions.runtime.isolation import isolate, tear_down
from sessions.runtime.network import UserNetwork, parse
from tests.conftest import RUN_ID, TEST_NETWORK_PREFIX
from tests.helpers.lab import Lab, start_lab

pytestmark = pytest.mark.docker
IMAGE = "gpu-portal/busybox:latest"


@pytest.fixture(scope="module")
def lab(user_network: UserNetwork) -> Iterator[Lab]:
    started = start_lab(RUN_ID)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def online_network(user_network: UserNetwork) -> Iterator[UserNetwork]:
    """A second bridge like the run's (which has the internet off, so tests never send anything out),
    with the internet setting on, as it is by default; its 'internet' is the lab's address."""
    third = int(str(user_network.subnet.network_address).split(".")[2])
    subnet = f"10.89.{third}.0/24"
    network = parse(f"{TEST_NETWORK_PREFIX}{RUN_ID}-on", subnet, True, user_network.hub_port)
    runtime = DockerRuntime()
    isolate(network, runtime)
    yield network
    for container_id in runtime.containers_on(network.name):
        runtime.remove(container_id)
    tear_down(network, runtime)


def run(network: str, script: str) -> str:
    """Run a shell script in a busybox container on a network, as an unprivileged user; its output."""
    output = DockerRuntime().client.containers.run(
        IMAGE, ["sh", "-c", script], network=network, user="65534", cap_drop=["ALL"], remove=True
    )
    return bytes(output).decode().strip()


def reach(address: str, port: int) -> str:
    return f"if nc -w 3 {address} {port} </dev/null >/dev/null 2>&1; then echo open; else echo closed; fi"


def test_a_user_container_reaches_the_internet_but_no_private_address(online_network: UserNetwork, lab: Lab) -> None:
    assert run(online_network.name, reach(lab.public_address, lab.port)) == "open"
    assert run(online_network.name, reach(lab.private_address, lab.port)) == "closed"


def test_with_the_internet_off_a_user_container_reaches_nothing_outside(user_network: UserNetwork, lab: Lab) -> None:
    assert not user_network.internet
    assert run(user_network.name, reach(lab.public_address, lab.port)) == "closed"
    assert run(user_network.name, reach(lab.private_address, lab.port)) == "closed"


def test_the_lab_answers_the_host_itself(lab: Lab) -> None:
    """The probes above mean something only if the lab really answers when nothing is in the way."""
    with socket.create_connection((lab.public_address, lab.port), timeout=3) as connection:
        assert connection.recv(3) == b"lab"


def test_two_user_containers_cannot_talk_to_each_other(user_network: UserNetwork) -> None:
    runtime = DockerRuntime()
    listener = runtime.client.containers.run(
        IMAGE, ["nc", "-l", "-p", "8000"], network=user_network.name, user="65534", detach=True
    )
    try:
        listener.reload()
        address = listener.attrs["NetworkSettings"]["Networks"][user_network.name]["IPAddress"]
        assert run(user_network.name, reach(address, 8000)) == "closed"
    finally:
        listener.remove(force=True)


def test_a_firewall_flushed_behind_our_back_is_written_again_by_reconciliation(
    user_network: UserNetwork, gateway_listener: int, celery_worker: str, db: None
) -> None:
    assert run(user_network.name, reach(user_network.gateway, gateway_listener)) == "closed"
    Firewall(user_network).remove()  # what `iptables -F` or a careless operator does
    try:
        assert run(user_network.name, reach(user_network.gateway, gateway_listener)) == "open"
        counts = reconcile_sessions.delay().get(timeout=60)
        assert counts["firewall_repaired"] == 1
        assert run(user_network.name, reach(user_network.gateway, gateway_listener)) == "closed"
    finally:
        Firewall(user_network).apply()


def test_the_network_settings_refuse_what_cannot_work() -> None:
    from sessions.runtime.network import NetworkSpecError

    for name, subnet in (("bad name!", "10.88.0.0/24"), ("ok", "8.8.8.0/24"), ("ok", "10.88.0.0/30"), ("ok", "x")):
        with pytest.raises(NetworkSpecError):
            parse(name, subnet, True, 8081)
    assert settings.USER_NETWORK.isolated
