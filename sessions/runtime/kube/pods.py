"""A Kubernetes namespace's notebook pods as reconciliation sees a Docker engine's containers.

A GPU host whose engine is ``kube://NAMESPACE`` (``PORTAL_DOCKER_ENGINES``) runs its notebook servers as pods of
the cluster the portal runs in (``PortalKubeSpawner``). Reconciliation (``sessions.notebooks.reconcile``) then
lists that namespace's pods carrying this portal's instance label, once per round, and reads each session's
pod as it reads a container: running or not, when it started and ended, how (exit code, OOM). A running pod
is its session's proof of life; a session with no pod ended; a pod of an ended session is deleted.

The cluster's API is the one of the cluster the portal runs in (its service account), or
``PORTAL_KUBERNETES_API`` where set (a ``kubectl proxy``, a test's in-memory API server). An API that does not
answer raises ``RuntimeError_``, as an engine that does not answer does: nothing there is confirmed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from decimal import ROUND_CEILING, Decimal
from typing import Any

from django.conf import settings
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, ApiException, Configuration, CoreV1Api

from sessions.runtime.docker import ContainerState, RuntimeError_
from sessions.runtime.engine_config import KUBE as SCHEME
from sessions.runtime.spec import INSTANCE_LABEL, LABEL_PREFIX
from sessions.runtime.times import engine_time

SESSION_LABEL = f"{LABEL_PREFIX}.session"
SERVER_CONTAINER = "notebook"  # KubeSpawner's name for the server's container


def namespace_of(endpoint: str) -> str:
    return endpoint.removeprefix(SCHEME)


def state_of(pod: dict[str, Any], container: str = SERVER_CONTAINER) -> ContainerState:
    """One of the pod's containers (a notebook's server, unless told) as a container's state: running, started,
    finished, exit code, OOM."""
    status = pod.get("status") or {}
    containers = [c for c in status.get("containerStatuses") or [] if c.get("name") == container]
    state = (containers[0].get("state") or {}) if containers else {}
    running, ended = state.get("running") or {}, state.get("terminated") or {}
    alive = (
        status.get("phase") == "Running" and bool(running) and not (pod.get("metadata") or {}).get("deletionTimestamp")
    )
    started = engine_time(str(running.get("startedAt") or ended.get("startedAt") or ""))
    finished = engine_time(str(ended.get("finishedAt") or "")) if ended else None
    exit_code = int(ended["exitCode"]) if ended.get("exitCode") is not None else None
    return ContainerState(alive, finished, exit_code, ended.get("reason") == "OOMKilled", started)


QUANTITY = re.compile(r"^([0-9.]+)([eE][0-9]+|[KMGTPE]i|[kMGTPE])?$")
SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}  # fmt: skip


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity of bytes ("20Gi", "500M", "1e9", "1024") as a number of bytes, rounded up;
    ValueError for one that is not."""
    found = QUANTITY.match(quantity.strip())
    if found is None:
        raise ValueError(f"{quantity[:50]!r} is not a Kubernetes quantity")
    number, suffix = Decimal(found.group(1)), found.group(2) or ""
    factor = Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") and suffix[1:] else SUFFIXES.get(suffix, 1)
    return int((number * factor).to_integral_value(rounding=ROUND_CEILING))


def ours(labels: dict[str, str]) -> bool:
    return labels.get(INSTANCE_LABEL) == settings.INSTANCE_ID and SESSION_LABEL in labels


class PodRuntime:
    """One namespace's pods of this portal, listed once and kept for the round."""

    def __init__(self, endpoint: str) -> None:
        self.namespace = namespace_of(endpoint)
        self._pods: list[dict[str, Any]] | None = None

    def _call(self, work: Callable[[ApiClient], Awaitable[Any]]) -> Any:
        async def run() -> Any:
            if settings.KUBERNETES_API:
                configuration = Configuration(host=settings.KUBERNETES_API)
            else:
                configuration = Configuration()
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            async with ApiClient(configuration) as client:
                return await work(client)

        try:
            return asyncio.run(run())
        except (ApiException, config.ConfigException) as error:
            raise RuntimeError_(f"the Kubernetes API of namespace {self.namespace}: {error}") from None

    def pods(self) -> list[dict[str, Any]]:
        if self._pods is None:
            selector = f"{INSTANCE_LABEL}={settings.INSTANCE_ID},{SESSION_LABEL}"

            async def listed(client: ApiClient) -> list[dict[str, Any]]:
                core = CoreV1Api(client)
                found = await core.list_namespaced_pod(self.namespace, label_selector=selector, _request_timeout=10)
                listed = [client.sanitize_for_serialization(pod) for pod in found.items]
                # Checked here too: another portal's pod is never touched, whatever the server made of the selector.
                return [pod for pod in listed if ours((pod.get("metadata") or {}).get("labels") or {})]

            self._pods = self._call(listed)
        return self._pods

    def session_containers(self) -> dict[str, int]:
        """Every pod of a notebook session, by name, with its session's number."""
        return {pod["metadata"]["name"]: int(pod["metadata"]["labels"][SESSION_LABEL]) for pod in self.pods()}

    def container_state(self, session_id: int) -> ContainerState | None:
        """The session's pod, as a container's state; None if it has none."""
        for pod in self.pods():
            if pod["metadata"]["labels"].get(SESSION_LABEL) == str(session_id):
                return state_of(pod)
        return None

    def claim_sizes(self, names: list[str]) -> dict[str, int]:
        """The size of each of these persistent volume claims that exists: what the cluster holds for it (its
        capacity once bound, else what it asks for), in bytes."""
        wanted = set(names)

        async def listed(client: ApiClient) -> dict[str, int]:
            found = await CoreV1Api(client).list_namespaced_persistent_volume_claim(self.namespace, _request_timeout=10)
            sizes = {}
            for claim in found.items:
                if claim.metadata.name not in wanted:
                    continue
                held = (claim.status.capacity if claim.status else None) or {}
                asked = (claim.spec.resources.requests if claim.spec and claim.spec.resources else None) or {}
                size = held.get("storage") or asked.get("storage")
                if size:
                    sizes[claim.metadata.name] = quantity_bytes(str(size))
            return sizes

        return self._call(listed)  # type: ignore[no-any-return]

    def remove(self, name: str) -> None:
        async def deleted(client: ApiClient) -> None:
            try:
                await CoreV1Api(client).delete_namespaced_pod(name, self.namespace, _request_timeout=10)
            except ApiException as error:
                if error.status != 404:
                    raise

        self._call(deleted)
