"""A person's work folder on a Kubernetes node is their own claim (``PortalKubeSpawner``): the periodic measure
counts it against their storage quota as what the cluster holds for it (its capacity once bound, else what it
asks for), through the in-memory API server; a claim that does not exist counts nothing, another claim of the
namespace is nobody's. Once a person's claims fill their quota, a new session is refused, saying so."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api

from sessions.notebooks import storage
from sessions.notebooks.models import WorkVolume
from sessions.runtime.kube.pods import quantity_bytes
from sessions.storage.models import StorageUse
from tests.kube.cluster import NAMESPACE, Cluster, in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
GIB = 2**30


def claim(name: str, asked: str, bound: str | None) -> dict[str, Any]:
    status = {"phase": "Bound", "capacity": {"storage": bound}} if bound else {"phase": "Pending"}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": asked}}},
        "status": status,
    }


async def test_work_claims_on_a_kube_host_count_against_their_owners_quota(
    cluster: Cluster,
    fleet: None,
    alice: User,
    bob: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.DOCKER_ENGINES = {"gpu-node-2": f"kube://{NAMESPACE}", "gpu-node-3": f"kube://{NAMESPACE}"}
    settings.KUBERNETES_API = cluster.url
    settings.STORAGE_QUOTA_BYTES = 10 * GIB
    carol = await in_thread(lambda: User.objects.create_user("carol"))
    volumes = {user.username: await in_thread(WorkVolume.for_owner, user.pk) for user in (alice, bob, carol)}
    async with ApiClient(Configuration(host=cluster.url)) as client:
        core = CoreV1Api(client)
        for made in (
            claim(volumes["alice"].name, "10Gi", "20Gi"),  # bound to a larger volume than it asked for
            claim(volumes["bob"].name, "5Gi", None),  # not bound yet: what it asks for
            claim("hub-db-dir", "1Gi", "1Gi"),  # the hub's own: nobody's work folder
        ):
            await core.create_namespaced_persistent_volume_claim(NAMESPACE, made)  # type: ignore[arg-type]

    measured = await in_thread(storage.measure_all)

    assert measured >= 2
    uses = await in_thread(lambda: {(use.owner.username, use.key): use.bytes for use in StorageUse.objects.all()})
    assert uses == {
        ("alice", f"{volumes['alice'].name}@gpu-node-2"): 20 * GIB,
        ("bob", f"{volumes['bob'].name}@gpu-node-2"): 5 * GIB,
    }
    refusal = await in_thread(storage.launch_refusal, alice)
    assert refusal is not None and "fill your storage quota" in refusal
    assert await in_thread(storage.launch_refusal, bob) is None


def test_kubernetes_quantities_of_bytes_are_read_as_the_api_writes_them() -> None:
    assert quantity_bytes("20Gi") == 20 * GIB
    assert quantity_bytes("500M") == 500 * 10**6
    assert quantity_bytes("1.5Ki") == 1536
    assert quantity_bytes("1e3") == 1000
    assert quantity_bytes("12") == 12
    assert quantity_bytes("0.1") == 1, "rounded up: a claim never counts less than it holds"
    for bad in ("", "Gi", "12 Gi", "-1Gi", "1Qi"):
        with pytest.raises(ValueError, match="not a Kubernetes quantity"):
            quantity_bytes(bad)
