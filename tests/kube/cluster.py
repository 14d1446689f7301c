"""A cluster for the Kubernetes tests (issue 34): kmock's in-memory API server, taught the few things a real one
does that our code relies on, and a stand-in for the scheduler and kubelet. A pod pinned to a node with room
runs (Running, ready, an address, its container started a while ago); one pinned to a node without room is
refused the way the scheduler refuses it (PodScheduled false, Unschedulable, its words)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from django.db import connection
from kmock import KubernetesEmulator, action
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api

from tests.kube.job_kubelet import JOB_NAME, LOGS

NAMESPACE = "gpu-portal"
FLEET = "gpu-node-2: 1xA100-80GB:mig; gpu-node-3: 1xL4:whole"
STARTED_AGO_S = 20
REFUSAL = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector."
KINDS = (
    "v1/pods",
    "v1/persistentvolumeclaims",
    "v1/events",
    "v1/secrets",
    "batch/v1/jobs",
    "resource.k8s.io/v1/resourceclaims",
)


class ApiServer(KubernetesEmulator):
    """kmock's emulator, filling in what a real API server gives every object it creates: its namespace (from
    the request's path), a uid and a creation time; and taking ``watch=True`` (what the Python client sends)
    for a watch, as the API server's boolean parsing does (kmock knows ``watch=true`` alone); and a new
    resourceVersion with every change, which watchers resume from."""

    versions = itertools.count(1)
    logs = LOGS  # what the pods' containers printed (the Job kubelet's, tests/kube/job_kubelet.py)

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and request.resource.plural == "pods" and request.subresource == "log":
            return await self._serve_log(request)
        if request.action == action.LIST and request.params.get("watch", "").lower() in ("true", "1"):
            object.__setattr__(request, "action", action.WATCH)  # the same request: kmock matches by identity
        if request.action in (action.CREATE, action.UPDATE) and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            metadata["resourceVersion"] = str(next(self.versions))
            if request.action == action.CREATE:
                if request.namespace:
                    metadata.setdefault("namespace", request.namespace)
                metadata.setdefault("uid", str(uuid.uuid4()))
                metadata.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
                request.data.setdefault("status", {"phase": "Pending"} if request.resource.plural == "pods" else {})
        return await super()._handle(request)

    async def _serve_log(self, request: Any) -> web.StreamResponse:
        """A container's log: what it printed so far, and with ``follow`` the rest as it comes, until it ends."""
        key = (request.name, request.params.get("container", ""))
        answer = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await answer.prepare(request._raw_request)
        sent, follow = 0, request.params.get("follow", "").lower() in ("true", "1")
        while True:
            ended = key in self.logs.ended  # seen before the lines: none printed before its end is left out
            lines = list(self.logs.lines.get(key, []))
            for line in lines[sent:]:
                await answer.write(line + b"\n")
            sent = len(lines)
            if not follow or ended:
                break
            await asyncio.sleep(0.05)
        await answer.write_eof()
        return answer


@dataclass
class Cluster:
    """The in-memory API server, and the nodes the stand-in scheduler finds room on."""

    url: str
    room_on: set[str]


def node_of(pod: dict[str, Any]) -> str:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return str(terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0])


async def kubelet(cluster: Cluster, stop: asyncio.Event) -> None:
    """Every new pod: running on a node with room (an address, its container ready, a uid), or refused by
    the scheduler as Kubernetes refuses it."""
    async with ApiClient(Configuration(host=cluster.url)) as client:
        core, seen = CoreV1Api(client), set()
        while not stop.is_set():
            for pod in (await core.list_namespaced_pod(NAMESPACE)).items:
                raw = client.sanitize_for_serialization(pod)
                name = raw["metadata"]["name"]
                if name in seen or (raw.get("status") or {}).get("phase") != "Pending":
                    continue  # done, or placed already (a test's own pod)
                if JOB_NAME in (raw["metadata"].get("labels") or {}):
                    continue  # a render run's: the Job kubelet runs it
                seen.add(name)
                # The container started a while before the kubelet says so: the moment billing must take.
                now = (datetime.now(UTC) - timedelta(seconds=STARTED_AGO_S)).isoformat()
                if node_of(raw) in cluster.room_on:
                    status = {
                        "phase": "Running",
                        "podIP": "127.0.0.1",
                        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                        "containerStatuses": [
                            {"name": "notebook", "ready": True, "restartCount": 0, "image": "gpu-portal/notebook",
                             "imageID": "", "state": {"running": {"startedAt": now}}}
                        ],
                    }  # fmt: skip
                    patch = {"spec": {"nodeName": node_of(raw)}, "status": status}
                else:
                    condition = {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": REFUSAL,
                    }
                    patch = {
                        "metadata": {"uid": f"uid-{name}"},
                        "status": {"phase": "Pending", "conditions": [condition]},
                    }
                await core.patch_namespaced_pod(name, NAMESPACE, patch)
            await asyncio.sleep(0.1)


async def in_thread(work: Callable[..., Any], *args: Any) -> Any:
    """Database work off the event loop (the tests' API server runs on it), its thread's connection closed after:
    none is left to the test database's teardown."""

    def run() -> Any:
        try:
            return work(*args)
        finally:
            connection.close()

    return await asyncio.to_thread(run)
