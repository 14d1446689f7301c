"""Our JupyterHub spawner on Kubernetes: KubeSpawner, told by the portal what to run on which GPU slice.

The same handshake with the portal as the Docker spawner (``PortalHandshake``: the launch spec asked for, the
session's moments reported), applied to a pod: the slice as Kubernetes is asked for it
(``sessions.runtime.kube.slices``: the device plugin's resource and a required node affinity to the node our
allocator chose, or a DRA claim naming the device), the container spec's CPU and memory limits and labels, the
person's work folder on a claim of their own, and the hardening every user container gets: not root, no
privilege escalation, no capabilities, a read-only root with writable home and /tmp, the runtime's seccomp
profile and no token of the cluster's API. Like the Docker spawner it runs inside the hub's process and
imports nothing of Django.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import ApiException, ResourceV1Api
from kubernetes_asyncio.client.models import CoreV1ResourceClaim, V1PodResourceClaim
from kubespawner import KubeSpawner
from traitlets import Float, Unicode, default, validate

from sessions.notebooks.spawner import HOME, PortalHandshake
from sessions.runtime.kube.manifests import CONTAINER_SECURITY, POD_SECURITY, label_value
from sessions.runtime.kube.slices import DEVICE_PLUGIN, DRA, WAYS, KubeSlice
from sessions.runtime.spec import ContainerSpec

NOTEBOOK_USER = 1000  # jovyan, the notebook image's user (compose/images/notebook/Dockerfile)
JOVYAN_HOME = "/home/jovyan"


class PortalKubeSpawner(PortalHandshake, KubeSpawner):
    slice_request = Unicode(
        DEVICE_PLUGIN,
        help="How a pod asks for its slice: 'device-plugin' (NVIDIA's extended resources with node affinity) or "
        "'dra' (a resource.k8s.io/v1 ResourceClaim that selects the device the allocator chose).",
    ).tag(config=True)

    unschedulable_poll_interval = Float(0.2, help="Seconds between looks at the pod's scheduling.").tag(config=True)
    scratch_limit = Unicode(
        "10Gi",
        help="The most a server's home and /tmp (the node's disk, gone with the pod) may each hold; past it the "
        "kubelet evicts the pod, as a node's disk must not fill (work/ is the person's claim, kept).",
    ).tag(config=True)

    kube_slice: KubeSlice | None = None
    own_claim = ""  # the DRA claim made for this pod alone, removed with it
    # KubeSpawner's traits, typed for our use of them (annotations only: the traits stay).
    environment: dict[str, Any]
    extra_labels: dict[str, str]
    extra_annotations: dict[str, str]

    @validate("slice_request")
    def _one_of_the_ways(self, proposal: Any) -> str:
        if proposal["value"] not in WAYS:
            raise ValueError(f"slice_request is one of {', '.join(WAYS)} (got {proposal['value']!r})")
        return str(proposal["value"])

    @default("storage_capacity")
    def _work_volume_size(self) -> str:  # Zero to JupyterHub's singleuser.storage.capacity sets it
        return "10Gi"

    def _harden(self) -> None:
        """Every user container's hardening, whatever the chart's values or a profile say (a notebook is
        hostile): not root, no privilege escalation, no capabilities, a read-only root, the runtime's seccomp
        profile, no token of the cluster's API."""
        self.uid = self.gid = self.fs_gid = NOTEBOOK_USER
        self.allow_privilege_escalation = False
        self.privileged = False
        self.automount_service_account_token = False
        self.container_security_context = {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True, "runAsNonRoot": True}
        self.pod_security_context = {
            **POD_SECURITY,
            "runAsUser": NOTEBOOK_USER,
            "runAsGroup": NOTEBOOK_USER,
            "fsGroup": NOTEBOOK_USER,
        }

    def _apply(self, launch: dict[str, Any]) -> None:
        """The portal's launch spec onto KubeSpawner's traits."""
        self._harden()
        self.session_id = int(launch["session"])
        spec = ContainerSpec.from_json(launch["container"])
        self.kube_slice = taken = KubeSlice.from_launch(launch)
        self.image = spec.image
        self.cpu_limit = self.cpu_guarantee = spec.limits.cpus
        self.mem_limit = self.mem_guarantee = spec.limits.memory_bytes
        limits = {"CPU_LIMIT": str(spec.limits.cpus), "MEM_LIMIT": str(spec.limits.memory_bytes)}
        self.environment = {**self.environment, **limits, **launch["environment"]}
        self.extra_labels = {**self.extra_labels, **{key: label_value(v) for key, v in spec.labels.items()}}
        self.extra_annotations = {**self.extra_annotations, **{f"{key}-full": v for key, v in spec.labels.items()}}
        self.node_affinity_required = [taken.node_affinity_term()]
        if self.slice_request == DEVICE_PLUGIN:
            self.extra_resource_limits = self.extra_resource_guarantees = taken.limits()
        else:
            self.extra_resource_limits = self.extra_resource_guarantees = {}
        self.storage_pvc_ensure = True  # the person's work claim, made on the first start (the chart's is off)
        self.pvc_name = launch["volume"]
        self.volumes = {
            "work": {"name": "work", "persistentVolumeClaim": {"claimName": self.pvc_name}},
            "home": {"name": "home", "emptyDir": {"sizeLimit": self.scratch_limit}},
            "tmp": {"name": "tmp", "emptyDir": {"sizeLimit": self.scratch_limit}},
        }
        self.volume_mounts = {
            "home": {"name": "home", "mountPath": JOVYAN_HOME},
            "work": {"name": "work", "mountPath": HOME},
            "tmp": {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108  # the pod's own, not the node's
        }

    async def get_pod_manifest(self) -> Any:
        """KubeSpawner's pod, with the DRA claim referenced where the slice is asked for that way."""
        pod = await super().get_pod_manifest()
        if self.slice_request == DRA and self.kube_slice is not None:
            (claim,) = self.kube_slice.pod_claims(self.pod_name)
            pod.spec.resource_claims = [
                V1PodResourceClaim(name=claim["name"], resource_claim_name=claim["resourceClaimName"])
            ]
            pod.spec.containers[0].resources.claims = [CoreV1ResourceClaim(name="gpu")]
        return pod

    def resource_claim(self) -> dict[str, Any]:
        """The slice's ResourceClaim (DRA), labelled as the pod is."""
        assert self.kube_slice is not None
        labels = self._build_common_labels(self._expand_all(self.extra_labels))
        return self.kube_slice.resource_claim(self.pod_name, self.namespace, labels)

    async def _ensure_claim(self) -> None:
        """Create the slice's claim before its pod; a share's claim (its GPU's, for every tenant) may exist.
        The pod's own claim is remembered in the hub's state, so a hub restarted since still removes it."""
        assert self.kube_slice is not None
        claim: Any = self.resource_claim()  # the client sends a plain dictionary as it is
        try:
            await ResourceV1Api(self.api.api_client).create_namespaced_resource_claim(
                self.namespace, claim, _request_timeout=self.k8s_api_request_timeout
            )
        except ApiException as error:
            if error.status != 409:
                raise
        if self.kube_slice.kind != "shared":
            self.own_claim = claim["metadata"]["name"]

    async def _remove_claim(self) -> None:
        """The pod's own claim, once the pod is gone (a share's stays: other tenants' pods reference it)."""
        if not self.own_claim:
            return
        try:
            await ResourceV1Api(self.api.api_client).delete_namespaced_resource_claim(
                self.own_claim, self.namespace, _request_timeout=self.k8s_api_request_timeout
            )
        except ApiException as error:
            if error.status != 404:
                raise
        self.own_claim = ""

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.own_claim:
            state["own_claim"] = self.own_claim
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.own_claim = str(state.get("own_claim", ""))

    def _unschedulable(self) -> str:
        """The scheduler's words when it has said it cannot place our pod (its PodScheduled condition), else
        "". A pod pinned to one node by our allocator waits there in vain: the node is full or gone."""
        pod = self.pod_reflector.pods.get(f"{self.namespace}/{self.pod_name}") if self.pod_reflector else None
        for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message") or "no node can take it")
        return ""

    async def _placed_or_refused(self) -> Any:
        """KubeSpawner's start, unless the scheduler says first that it cannot place the pod: then the pod is
        deleted and the start fails at once with the scheduler's words (KubeSpawner would wait out its start
        timeout for a pod that will never run)."""
        started = asyncio.ensure_future(super().start())
        while not started.done():
            refusal = self._unschedulable()
            if refusal:
                started.cancel()
                await super().stop(now=True)
                await self._remove_claim()
                raise Unschedulable(refusal)
            await asyncio.wait([started], timeout=self.unschedulable_poll_interval)
        return started.result()

    def _started_at(self) -> str:
        """When the kubelet started the server's container (what billing charges from), as the pod says;
        "" where it does not say (the portal then takes the report's arrival)."""
        pod = self.pod_reflector.pods.get(f"{self.namespace}/{self.pod_name}") if self.pod_reflector else None
        for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
            running = (status.get("state") or {}).get("running") or {}
            if status.get("name") == "notebook" and running.get("startedAt"):
                return str(running["startedAt"])
        return ""

    async def start(self) -> Any:
        self._steps, self._starting = [], True
        try:
            self._step(10, "Slice allocated; asking the portal for the launch spec")
            self._apply(await self._fetch_spec())
            assert self.kube_slice is not None
            where = f"{self.kube_slice.resource} on {self.kube_slice.node}"
            self._step(30, f"Creating the pod ({where})")
            self._report_soon("progress", message="Creating the pod")
            try:
                if self.slice_request == DRA:
                    await self._ensure_claim()
                url = await self._placed_or_refused()
                self._report_soon("container_started", container_id=self.pod_name, at=self._started_at())
                self._step(90, "The pod runs; the hub waits for JupyterLab to answer")
            except Unschedulable as refused:
                reason = f"The cluster cannot place this session on its GPU host now ({refused}). Try again later."
                self._report_soon("failed", message=f"unschedulable: {refused}", reason=reason)
                raise
            except Exception as error:
                self._report_soon("failed", message=str(error))
                raise
            self._report_soon("ready")
            return url
        finally:
            self._starting = False

    async def stop(self, now: bool = False) -> None:
        """The pod deleted (KubeSpawner waits until it is gone), then its end reported at that moment."""
        session_id = self.session_id
        await super().stop(now=now)
        await self._remove_claim()
        if session_id:
            self._report_soon("stopped", at=datetime.now(UTC).isoformat())


class Unschedulable(RuntimeError):
    """The scheduler cannot place the pod; the message is its own."""
