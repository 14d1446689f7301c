"""What the portal asks a Kubernetes cluster for (issue 34), checked against the API's OpenAPI schema of a stated
version (kubernetes-validate, offline, strict: an unknown field fails). No cluster runs here: this proves the
objects are ones the API server would take, in the shape of that version; not that a scheduler, the device
plugin or NVIDIA's DRA driver would do with them what the README says (that needs a cluster).

The pod and the work-volume claim are KubeSpawner's own (our subclass, fed a launch spec as the portal makes
it); the ResourceClaim and the network policy are ours."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_asyncio.client import ApiClient

from sessions.notebooks.kubespawner import PortalKubeSpawner
from sessions.runtime.kube.manifests import label_value, server_network_policy
from sessions.runtime.kube.slices import DEVICE_PLUGIN, DRA, KubeSlice
from sessions.runtime.spec import ContainerSpec, Limits

# The schema the specs are checked against: the first version with resource.k8s.io/v1 (DRA's GA API).
KUBERNETES = "1.34.0"
NAMESPACE = "gpu-portal"
GPU = "GPU-5c3f0a55-8d54-4a1b-9e7e-0d2c9b1f7a10"
SLICES = {
    "mig": KubeSlice("mig", "1g.18gb", "gpu-node-2", GPU, "MIG-1b2c3d4e-0000-5a6b-8c7d-9e0f1a2b3c4d"),
    "whole": KubeSlice("whole", "", "gpu-node-3", GPU, GPU),
    "shared": KubeSlice("shared", "", "gpu-node-3", GPU, GPU),
}


@dataclass
class HubUser:
    name: str = "alice"
    id: int = 7
    url: str = "/jupyter/user/alice/"
    escaped_name: str = "alice"
    settings: dict[str, Any] = field(default_factory=dict)


def launch_spec(taken: KubeSlice) -> dict[str, Any]:
    """A launch spec as the portal's internal API makes it (sessions.notebooks.api.spec)."""
    labels = {
        "gpu-portal.instance": "a1b2c3",
        "gpu-portal.device": taken.device_uuid,
        "gpu-portal.holder": "notebook:12",
    }
    container = ContainerSpec("gpu-portal/notebook:latest", (taken.device_uuid,), Limits(2.0, 8 * 2**30, 1024), labels)
    return {
        "session": 12,
        "container": container.to_json(),
        "host": taken.node,
        "slice": {"kind": taken.kind, "profile": taken.profile, "gpu": taken.gpu_uuid, "device": taken.device_uuid},
        "environment": {"GPU_PORTAL_SESSION": "12"},
        "volume": "gpu-portal-work-0123456789abcdef0123456789abcdef",
    }


def spawner(way: str) -> PortalKubeSpawner:
    return PortalKubeSpawner(
        _mock=True, user=HubUser(), namespace=NAMESPACE, slice_request=way, k8s_api_host="http://127.0.0.1:1"
    )


def plain(model: Any) -> dict[str, Any]:
    return dict(ApiClient().sanitize_for_serialization(model))


async def applied(way: str, taken: KubeSlice) -> tuple[PortalKubeSpawner, dict[str, Any], dict[str, Any]]:
    """Our spawner given the launch spec of ``taken``: itself, its pod (schema-checked) and the pod's container."""
    made = spawner(way)
    made._apply(launch_spec(taken))
    pod = valid(plain(await made.get_pod_manifest()))
    (container,) = pod["spec"]["containers"]
    return made, pod, container


def valid(manifest: dict[str, Any]) -> dict[str, Any]:
    kubernetes_validate.validate(manifest, KUBERNETES, strict=True)  # raises ValidationError naming the field
    return manifest


@pytest.mark.parametrize("kind", sorted(SLICES))
async def test_the_pod_asks_the_device_plugin_for_the_slice_on_the_chosen_node(kind: str) -> None:
    taken = SLICES[kind]
    _, pod, container = await applied(DEVICE_PLUGIN, taken)
    resource = {"mig": "nvidia.com/mig-1g.18gb", "whole": "nvidia.com/gpu", "shared": "nvidia.com/gpu.shared"}[kind]
    assert container["resources"]["limits"] == {"cpu": 2.0, "memory": 8 * 2**30, resource: "1"}
    assert container["resources"]["requests"][resource] == "1"
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [taken.node]}]}
    assert "resourceClaims" not in pod["spec"]


async def test_the_pod_is_hardened_and_mounts_the_persons_work_claim() -> None:
    made = spawner(DEVICE_PLUGIN)
    made._apply(launch_spec(SLICES["mig"]))
    pod = valid(plain(await made.get_pod_manifest()))
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True and security["privileged"] is False
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert mounts == {"/home/jovyan": "home", "/home/jovyan/work": "work", "/tmp": "tmp"}  # noqa: S108
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert volumes["work"]["persistentVolumeClaim"] == {"claimName": made.pvc_name}
    assert volumes["home"]["emptyDir"] == volumes["tmp"]["emptyDir"] == {"sizeLimit": "10Gi"}, "the node's disk bounded"
    # The portal's labels, in label values' alphabet; the full values as annotations.
    assert pod["metadata"]["labels"]["gpu-portal.holder"] == "notebook-12"
    assert pod["metadata"]["annotations"]["gpu-portal.holder-full"] == "notebook:12"
    environment = {item["name"]: item.get("value") for item in container["env"]}
    assert environment["GPU_PORTAL_SESSION"] == "12" and environment["MEM_LIMIT"] == str(8 * 2**30)
    claim = valid(plain(made.get_pvc_manifest()))
    assert claim["metadata"]["name"] == "gpu-portal-work-0123456789abcdef0123456789abcdef"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize("kind", sorted(SLICES))
async def test_with_dra_the_pod_references_a_claim_that_selects_the_chosen_device(kind: str) -> None:
    taken = SLICES[kind]
    made, pod, container = await applied(DRA, taken)
    assert not {name for name in container["resources"]["limits"] if name.startswith("nvidia.com/")}
    assert container["resources"]["claims"] == [{"name": "gpu"}]
    claim = valid(made.resource_claim())
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == ("mig.nvidia.com" if kind == "mig" else "gpu.nvidia.com")
    assert request["exactly"]["selectors"] == [
        {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].uuid == '{taken.device_uuid}'"}}
    ]
    if kind == "shared":  # one claim per GPU, which every tenant's pod references, time-sliced by the driver
        assert claim["metadata"]["name"] == f"gpu-portal-share-{GPU.lower()}"
        (config,) = claim["spec"]["devices"]["config"]
        assert config["opaque"]["parameters"]["sharing"]["strategy"] == "TimeSlicing"
    else:
        assert claim["metadata"]["name"] == f"{made.pod_name}-gpu" and "config" not in claim["spec"]["devices"]


def test_the_servers_reach_the_hub_alone_and_only_the_hub_and_proxy_reach_them() -> None:
    policy = valid(server_network_policy(NAMESPACE, hub_port=8081))
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["podSelector"] == {"matchLabels": {"app": "jupyterhub", "component": "singleuser-server"}}
    (to_hub, to_dns) = spec["egress"]
    assert to_hub == {
        "to": [{"podSelector": {"matchLabels": {"app": "jupyterhub", "component": "hub"}}}],
        "ports": [{"protocol": "TCP", "port": 8081}],
    }
    assert {port["port"] for port in to_dns["ports"]} == {53}
    (inbound,) = spec["ingress"]
    assert {peer["podSelector"]["matchLabels"]["component"] for peer in inbound["from"]} == {"hub", "proxy"}


def test_a_decision_kubernetes_cannot_be_asked_for_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="kind is one of mig, whole, shared"):
        KubeSlice("mps", "", "gpu-node-1", GPU, GPU)
    with pytest.raises(ValueError, match="has a MIG profile such as 1g.18gb"):
        KubeSlice("mig", "", "gpu-node-1", GPU, GPU)
    with pytest.raises(ValueError, match="has a MIG profile"):
        KubeSlice("whole", "1g.18gb", "gpu-node-1", GPU, GPU)
    with pytest.raises(ValueError, match="device UUID is not NVIDIA's"):
        KubeSlice("whole", "", "gpu-node-1", GPU, "gpu0")
    with pytest.raises(ValueError, match="slice_request is one of device-plugin, dra"):
        spawner("mps")
    assert label_value("notebook:12") == "notebook-12"
    assert len(label_value("x" * 80)) == 63


def test_an_invalid_object_fails_the_schema_check() -> None:
    """The check can fail: a pod with a field its version does not know, or a claim of the old shape."""
    with pytest.raises(kubernetes_validate.ValidationError):
        valid({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containerz": []}})
    old = SLICES["whole"].resource_claim("w", NAMESPACE, {})
    old["spec"]["devices"]["requests"][0]["deviceClassName"] = "gpu.nvidia.com"  # v1beta1's place for it
    with pytest.raises(kubernetes_validate.ValidationError):
        valid(old)


async def test_the_hardening_holds_whatever_the_configuration_says() -> None:
    """A chart's values or a profile asking for root, privilege or the API's token get none of them."""
    made = PortalKubeSpawner(
        _mock=True,
        user=HubUser(),
        namespace=NAMESPACE,
        k8s_api_host="http://127.0.0.1:1",
        uid=0,
        privileged=True,
        allow_privilege_escalation=True,
        automount_service_account_token=True,
        storage_pvc_ensure=False,
    )
    made._apply(launch_spec(SLICES["whole"]))
    pod = valid(plain(await made.get_pod_manifest()))
    (container,) = pod["spec"]["containers"]
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000 and pod["spec"]["automountServiceAccountToken"] is False
    assert container["securityContext"]["privileged"] is False
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert made.storage_pvc_ensure is True
