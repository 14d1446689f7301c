"""KubeSpawner reads a kube-config when it is made (outside a cluster), and the client library takes its path
from KUBECONFIG when it is imported: the tests' own, naming 127.0.0.1, set before anything imports it. The spec
tests never call the API; the lifecycle tests give the in-memory API server's address instead."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

KUBECONFIG = Path(tempfile.mkdtemp(prefix="gpu-portal-kube-")) / "kubeconfig"
KUBECONFIG.write_text(
    yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "tests", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [{"name": "tests", "user": {"token": "not-a-cluster"}}],
            "contexts": [{"name": "tests", "context": {"cluster": "tests", "user": "tests"}}],
            "current-context": "tests",
        }
    )
)
os.environ["KUBECONFIG"] = str(KUBECONFIG)

# Imported once KUBECONFIG is set (the client library reads it as it is imported).
from kmock import ResourceInfo, Server  # noqa: E402
from kubespawner import KubeSpawner  # noqa: E402

from tests.gpus.conftest import use_fleet  # noqa: E402
from tests.kube.cluster import FLEET, KINDS, ApiServer, Cluster, kubelet  # noqa: E402


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """The in-memory API server and its kubelet, for one test; KubeSpawner's watches of it stopped after."""
    async with ApiServer() as emulator, Server(emulator) as server:
        for kind in KINDS:
            emulator.resources[kind] = ResourceInfo()  # served (empty) before the first object of the kind exists
        found = Cluster(str(server.url).rstrip("/"), room_on={"gpu-node-2"})
        stop = asyncio.Event()
        running = asyncio.ensure_future(kubelet(found, stop))
        yield found
        stop.set()
        await running
        for reflector in list(KubeSpawner.reflectors.values()):  # watching this server: gone with it
            await reflector.stop()
        KubeSpawner.reflectors.clear()


@pytest.fixture
def fleet(transactional_db: None, settings) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, FLEET)
