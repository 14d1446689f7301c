"""The Kubernetes spawner's lifecycle (issue 34) through the real KubeSpawner code, talking HTTP to an in-memory
Kubernetes API server (kmock's emulator), with the portal (daphne on the test database) on the other side of
the handshake. The cluster (the API server and a stand-in for the scheduler and kubelet) is
tests/kube/cluster.py's: a pod pinned to a node that has room runs; one pinned to a node without room is
refused the way the scheduler refuses it.

What this proves: our spawner's requests are ones an API server takes, it follows the pod through KubeSpawner's
own watch, reports each moment to the portal, and fails an unschedulable pod at once with the scheduler's
reason on the session card, its slice released. What it does not: that a real scheduler decides the same."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api, ResourceV1Api

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.notebooks.kubespawner import PortalKubeSpawner, Unschedulable
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import stop_session
from sessions.runtime.kube.slices import DEVICE_PLUGIN, DRA
from tests.kube.cluster import NAMESPACE, REFUSAL, STARTED_AGO_S, Cluster, in_thread, node_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@dataclass
class HubUser:
    name: str
    id: int = 7
    url: str = ""
    escaped_name: str = ""
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.url = self.url or f"/jupyter/user/{self.name}/"
        self.escaped_name = self.escaped_name or self.name


def starting_session(owner: User, request: SliceRequest, name: str) -> NotebookSession:
    """A session the portal has given a slice and is starting: what the hub's start call finds."""
    image, _ = NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "gpu-portal/notebook:latest"})
    session = NotebookSession.objects.create(
        owner=owner, server_name=name, image=image, state=NotebookSession.State.STARTING
    )
    session.slice = allocate(owner, request, holder=Holder.notebook(session.pk))
    session.save(update_fields=["slice"])
    return session


def spawner(cluster: Cluster, portal: str, owner: User, name: str, way: str = DEVICE_PLUGIN) -> PortalKubeSpawner:
    return PortalKubeSpawner(
        slice_request=way,
        _mock=True,
        user=HubUser(owner.username),
        orm_spawner=SimpleNamespace(name=name, display_name=name, server=None, user_options={}),
        namespace=NAMESPACE,
        k8s_api_host=cluster.url,
        portal_url=portal,
        portal_token=settings.HUB_SERVICE_TOKEN,
        start_timeout=60,
        events_enabled=False,
    )


async def until(check: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await in_thread(check)
        if found:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} within {timeout:.0f} s")


def state_of(session: NotebookSession) -> NotebookSession:
    return NotebookSession.objects.select_related("slice").get(pk=session.pk)


async def test_a_session_is_spawned_polled_and_stopped_through_the_api_server(
    cluster: Cluster, portal_server: str, fleet: None, alice: User
) -> None:
    session = await in_thread(starting_session, alice, SliceRequest("mig", "1g.10gb"), "kube-one")
    made = spawner(cluster, portal_server, alice, "kube-one")
    url = await made.start()
    assert url.startswith("http://127.0.0.1:8888")
    async with ApiClient(Configuration(host=cluster.url)) as client:
        (pod,) = [
            client.sanitize_for_serialization(p) for p in (await CoreV1Api(client).list_namespaced_pod(NAMESPACE)).items
        ]
        claims = (await CoreV1Api(client).list_namespaced_persistent_volume_claim(NAMESPACE)).items
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1" and node_of(pod) == "gpu-node-2"
    assert pod["metadata"]["labels"]["gpu-portal.session"] == str(session.pk)
    (work,) = [volume for volume in pod["spec"]["volumes"] if volume["name"] == "work"]
    assert [claim.metadata.name for claim in claims] == [work["persistentVolumeClaim"]["claimName"]]
    running = await until(
        lambda: state_of(session).state == NotebookSession.State.RUNNING and state_of(session), "running"
    )
    started = running.container_started_at
    assert started is not None and started == running.slice.held_from  # charged from the container's own start
    assert STARTED_AGO_S - 1 < (datetime.now(UTC) - started).total_seconds() < STARTED_AGO_S + 20
    assert await made.poll() is None  # running, as KubeSpawner reads the pod
    await in_thread(stop_session, session.pk, alice)  # the owner stops it; the portal asks the hub
    await made.stop()  # what the hub then does
    async with ApiClient(Configuration(host=cluster.url)) as client:
        assert (await CoreV1Api(client).list_namespaced_pod(NAMESPACE)).items == []
    stopped = await until(
        lambda: state_of(session).state == NotebookSession.State.STOPPED and state_of(session), "stopped"
    )
    assert stopped.slice is not None and stopped.slice.released_at is not None


async def test_an_unschedulable_pod_fails_at_once_with_the_schedulers_reason_and_frees_the_slice(
    cluster: Cluster, portal_server: str, fleet: None, alice: User
) -> None:
    session = await in_thread(starting_session, alice, SliceRequest("whole", model="L4-24GB"), "kube-two")
    made = spawner(cluster, portal_server, alice, "kube-two")
    started = time.monotonic()
    with pytest.raises(Unschedulable, match="Insufficient nvidia.com/gpu"):
        await made.start()
    assert time.monotonic() - started < 15, "failed at once, not after the start timeout"
    async with ApiClient(Configuration(host=cluster.url)) as client:
        assert (await CoreV1Api(client).list_namespaced_pod(NAMESPACE)).items == []  # the refused pod deleted
    failed = await until(
        lambda: state_of(session).state == NotebookSession.State.FAILED and state_of(session), "failed"
    )
    assert failed.failure_message.startswith("The cluster cannot place this session on its GPU host now")
    assert REFUSAL in failed.failure_message
    assert failed.slice is not None and failed.slice.released_at is not None
    page = await in_thread(card_text, alice)
    assert "The cluster cannot place this session on its GPU host now" in page


def card_text(owner: User) -> str:
    from django.test import Client

    browser = Client()
    browser.force_login(owner)
    return browser.get("/sessions/").content.decode()


async def test_with_dra_the_pods_claim_is_made_before_it_and_removed_with_it(
    cluster: Cluster, portal_server: str, fleet: None, alice: User
) -> None:
    session = await in_thread(starting_session, alice, SliceRequest("mig", "1g.10gb"), "kube-three")
    made = spawner(cluster, portal_server, alice, "kube-three", DRA)
    await made.start()
    async with ApiClient(Configuration(host=cluster.url)) as client:
        (claim,) = (await ResourceV1Api(client).list_namespaced_resource_claim(NAMESPACE)).items
        (pod,) = (await CoreV1Api(client).list_namespaced_pod(NAMESPACE)).items
    assert pod.spec.resource_claims[0].resource_claim_name == claim.metadata.name == made.get_state()["own_claim"]
    device = (await in_thread(state_of, session)).slice.device_uuid
    assert claim.spec.devices.requests[0].exactly.selectors[0].cel.expression.endswith(f"== '{device}'")
    await in_thread(stop_session, session.pk, alice)
    await made.stop()
    async with ApiClient(Configuration(host=cluster.url)) as client:
        assert (await ResourceV1Api(client).list_namespaced_resource_claim(NAMESPACE)).items == []
    assert "own_claim" not in made.get_state()
