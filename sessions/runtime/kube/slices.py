"""A slice the allocator chose, as Kubernetes is asked for it.

Two ways, both from the same decision (host, GPU, device):

- **The device plugin** (NVIDIA's, as the GPU Operator installs it, MIG strategy ``mixed``): the container's
  limits name the resource (``nvidia.com/mig-<profile>`` for a MIG slice, ``nvidia.com/gpu`` for a whole GPU,
  ``nvidia.com/gpu.shared`` for a share: the time-slicing replicas, renamed) and a required node affinity pins
  the pod to the node the allocator chose. The kubelet then picks *which* device of that kind on that node:
  our allocator's count per node stays right as long as the portal alone places GPU pods there, but the GPU or
  MIG instance inside the node is the plugin's choice, and the layout of MIG instances is mig-manager's.
- **A DRA claim** (``resource.k8s.io/v1``, Kubernetes 1.34 and later, NVIDIA's DRA driver for GPUs): the claim
  selects the very device our allocator chose by its UUID (a CEL selector on the driver's ``uuid``
  attribute), so the scheduler can only put the pod where that device is. A share is one claim per GPU, which
  its tenants' pods all reference, configured for time-slicing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEVICE_PLUGIN, DRA = "device-plugin", "dra"
WAYS = (DEVICE_PLUGIN, DRA)
KINDS = ("mig", "whole", "shared")
HOSTNAME_LABEL = "kubernetes.io/hostname"
WHOLE_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"  # the device plugin's time-slicing replicas (renameByDefault: true)
DRA_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver: its name, and its attributes' domain
DEVICE_CLASSES = {"mig": "mig.nvidia.com", "whole": "gpu.nvidia.com", "shared": "gpu.nvidia.com"}
PROFILE = re.compile(r"^\d+g\.\d+gb(\+me)?$")
UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")


def own_claim(workload: str) -> str:
    """The name of a workload's own claim (a MIG slice's or a whole GPU's)."""
    return f"{workload}-gpu"


@dataclass(frozen=True)
class KubeSlice:
    """What the allocator decided for one workload: the kind of slice, its MIG profile, the node (the GPU
    host's name, which is the node's ``kubernetes.io/hostname``), the GPU and the device (a MIG device's UUID,
    or the GPU's). Refuses a decision Kubernetes could not be asked for, naming what is wrong."""

    kind: str
    profile: str
    node: str
    gpu_uuid: str
    device_uuid: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a slice's kind is one of {', '.join(KINDS)} (got {self.kind!r})")
        if (self.kind == "mig") != bool(PROFILE.match(self.profile)):
            raise ValueError(f"a MIG slice, and only one, has a MIG profile such as 1g.18gb (got {self.profile!r})")
        if not self.node:
            raise ValueError("a slice's node is its GPU host's name")
        for name, uuid in (("GPU", self.gpu_uuid), ("device", self.device_uuid)):
            if not UUID.match(uuid):
                raise ValueError(f"the slice's {name} UUID is not NVIDIA's (got {uuid!r})")

    @classmethod
    def from_launch(cls, launch: Mapping[str, Any]) -> KubeSlice:
        """From the portal's launch spec (``sessions.notebooks.api.spec``): its ``slice`` and ``host``."""
        given = launch["slice"]
        return cls(str(given["kind"]), str(given["profile"]), str(launch["host"]), given["gpu"], given["device"])

    # -- the device plugin --------------------------------------------------------------------------------

    @property
    def resource(self) -> str:
        """The device plugin's name for this kind of slice."""
        if self.kind == "mig":
            return f"nvidia.com/mig-{self.profile}"
        return WHOLE_RESOURCE if self.kind == "whole" else SHARED_RESOURCE

    def limits(self) -> dict[str, str]:
        return {self.resource: "1"}

    def node_affinity(self) -> dict[str, Any]:
        """A required node affinity to the chosen node (a pod's ``affinity``)."""
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [self.node]}]}
        ]}}}  # fmt: skip

    def node_affinity_term(self) -> dict[str, Any]:
        """The same as one of KubeSpawner's ``node_affinity_required`` terms."""
        return {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [self.node]}]}

    # -- Dynamic Resource Allocation ------------------------------------------------------------------------

    def claim_name(self, workload: str) -> str:
        """A share's claim is its GPU's, referenced by every tenant; any other is the workload's own."""
        if self.kind == "shared":
            return f"gpu-portal-share-{self.gpu_uuid.lower()}"[:63].rstrip("-")
        return own_claim(workload)

    def resource_claim(self, workload: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
        """The claim for this slice: the device our allocator chose, selected by its UUID."""
        selector = f"device.attributes['{DRA_DRIVER}'].uuid == '{self.device_uuid}'"
        request: dict[str, Any] = {
            "name": "gpu",
            "exactly": {
                "deviceClassName": DEVICE_CLASSES[self.kind],
                "selectors": [{"cel": {"expression": selector}}],
                "allocationMode": "ExactCount",
                "count": 1,
            },
        }
        devices: dict[str, Any] = {"requests": [request]}
        if self.kind == "shared":  # the driver's own configuration: the GPU time-sliced between the claim's pods
            parameters = {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}},
            }
            devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRA_DRIVER, "parameters": parameters}}]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": self.claim_name(workload), "namespace": namespace, "labels": dict(labels)},
            "spec": {"devices": devices},
        }

    def pod_claims(self, workload: str) -> list[dict[str, Any]]:
        """A pod's ``resourceClaims``: the claim, under the name its containers use."""
        return [{"name": "gpu", "resourceClaimName": self.claim_name(workload)}]

    def container_claims(self) -> list[dict[str, Any]]:
        """A container's ``resources.claims``."""
        return [{"name": "gpu"}]
