"""A notebook is hostile code: from inside its container it reaches the hub and nothing else of ours.

The session is launched the way a person's is (portal -> Celery -> hub -> spawner -> Docker), and the
probes run inside its container as the notebook user, with what a terminal in JupyterLab would have.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest
from sessions.notebooks.models import NotebookImage, NotebookSession, WorkVolume
from sessions.notebooks.services import Launch, start_session, stop_session
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.network import UserNetwork
from tests.conftest import STACK
from tests.helpers.waiting import state_of, wait_for

pytestmark = [pytest.mark.hub, pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]

# Runs inside the container: try each address and say what happened, without trusting anything it gets back.
PROBE = """
import json, os, socket, sys
result = {}
for host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=3).close()
        result[f"{host}:{port}"] = "open"
    except ConnectionRefusedError:
        result[f"{host}:{port}"] = "refused"
    except OSError as error:
        result[f"{host}:{port}"] = type(error).__name__
sockets = ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"]
result["sockets"] = [path for path in sockets if os.path.exists(path)]
result["uid"] = os.getuid()
with open("/proc/sys/net/ipv6/conf/all/disable_ipv6") as flag:
    result["ipv6_off"] = flag.read().strip() == "1"
print(json.dumps(result))
"""

# The hub's API with the notebook's own token: what may it do?
TOKEN_PROBE = """
import json, os, urllib.request, urllib.error
api, token = os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"]
def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(api + path, data=data, method=method, headers={"Authorization": "token " + token})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
print(json.dumps({
    "whoami": call("GET", "/user"),
    "list_users": call("GET", "/users"),
    "read_bob": call("GET", "/users/bob"),
    "start_another": call("POST", "/users/alice/servers/sneaky", {}),
    "stop_own_others": call("DELETE", "/users/alice/servers/other"),
    "new_token": call("POST", "/users/alice/tokens", {"note": "escape"}),
    "proxy_routes": call("GET", "/proxy"),
    "services": call("GET", "/services"),
    "api_url": api,
}))
"""


def running_container(owner: User, image: NotebookImage, name: str) -> tuple[NotebookSession, str]:
    """A session launched the way a person's is, once it runs, and its container's id."""
    session = start_session(owner, Launch(SliceRequest("mig", "1g.18gb"), image.pk, name))
    wait_for(lambda: state_of(session) == NotebookSession.State.RUNNING, 120, "the session to run")
    [container_id] = DockerRuntime().containers_for("session", str(session.pk))
    return session, container_id


def stopped(session: NotebookSession, owner: User) -> None:
    stop_session(session.pk, by=owner)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 60, "the session to stop")


def default_bridge_gateway(runtime: DockerRuntime) -> list[str]:
    """The host's address on Docker's default bridge (docker0), as the engine reports it."""
    configs = runtime.client.networks.get("bridge").attrs.get("IPAM", {}).get("Config") or []
    return [str(config["Gateway"]) for config in configs if config.get("Gateway")]


def service_ports(listener: int) -> dict[str, int]:
    """Every port the portal's processes use on this host (this run's stack), and the engine's TCP ports."""
    database = settings.DATABASES["default"]
    return {
        "redis": urlsplit(settings.REDIS_URL).port or 6379,
        "postgresql": int(str(database.get("PORT") or 5432)),
        "daphne": STACK["portal"],
        "proxy": STACK["public"],
        "proxy_api": STACK["proxy_api"],
        "docker_tcp": 2375,
        "docker_tls": 2376,
        "gateway_listener": listener,
    }


def test_a_notebook_reaches_the_hub_and_nothing_else_of_the_host(
    hub: str, notebook_image: NotebookImage, alice: User, user_network: UserNetwork, gateway_listener: int
) -> None:
    session, container_id = running_container(alice, notebook_image, "sandbox")
    runtime = DockerRuntime()
    attrs = runtime.client.containers.get(container_id).attrs
    assert attrs["HostConfig"]["NetworkMode"] == user_network.name
    assert not attrs["HostConfig"].get("PortBindings"), "nothing of a notebook is published on the host"
    assert attrs["HostConfig"]["CapDrop"] == ["ALL"]
    address = attrs["NetworkSettings"]["Networks"][user_network.name]["IPAddress"]
    assert address.startswith(str(user_network.subnet.network_address).rsplit(".", 1)[0] + ".")

    ports = service_ports(gateway_listener)
    # The container's own loopback, our bridge's gateway, and the gateway of the engine's default bridge.
    hosts = ["127.0.0.1", user_network.gateway, *default_bridge_gateway(runtime)]
    targets = [(host, port) for host in hosts for port in ports.values()]
    targets.append((user_network.gateway, user_network.hub_port))
    seen = json.loads(runtime.run_in(container_id, ["python3", "-c", PROBE, json.dumps(targets)]))

    assert seen["uid"] == 1000
    assert seen["sockets"] == []
    assert seen["ipv6_off"] is True
    assert seen.pop(f"{user_network.gateway}:{user_network.hub_port}") == "open"
    reached = {target: outcome for target, outcome in seen.items() if outcome == "open"}
    assert reached == {}, f"a notebook reached {reached}"
    # Refused at once (a reset from the firewall or nothing listening), not left to time out.
    assert {outcome for target, outcome in seen.items() if ":" in target} == {"refused"}

    stopped(session, alice)


def test_a_notebooks_hub_token_may_only_report_activity_and_open_its_own_server(
    hub: str, notebook_image: NotebookImage, alice: User, bob: User, user_network: UserNetwork
) -> None:
    session, container_id = running_container(alice, notebook_image, "tokens")
    seen = json.loads(DockerRuntime().run_in(container_id, ["python3", "-c", TOKEN_PROBE]))
    assert seen.pop("api_url") == f"{user_network.hub_url}/jupyter/hub/api"
    assert seen.pop("whoami") == 200
    assert seen == {
        "list_users": 403,
        "read_bob": 404,  # the hub does not even say whether bob exists
        "start_another": 403,
        "stop_own_others": 403,
        "new_token": 403,
        "proxy_routes": 403,
        "services": 403,
    }
    stopped(session, alice)


def test_a_session_mounts_its_owners_own_work_volume(hub: str, notebook_image: NotebookImage, alice: User) -> None:
    session, container_id = running_container(alice, notebook_image, "volume")
    mounts = DockerRuntime().client.containers.get(container_id).attrs["Mounts"]
    [work] = [mount for mount in mounts if mount["Destination"] == "/home/jovyan/work"]
    assert work["Name"] == WorkVolume.objects.get(owner=alice).name
    stopped(session, alice)
