"""A render chunk's run as a Kubernetes Job, pinned to the slice the allocator chose, as a notebook's pod is.

The Job runs once (``backoffLimit: 0``: a failed attempt is the portal's to queue again, as on a Docker host),
within a deadline (Blender's wall time and STAGING_S for the files), and is removed by the cluster a while after
it ended. Its pod has no token of the cluster's API, no Service environment, never root; three containers share
it, each with only the volumes it needs:

- ``fetch`` (init container, the portal's image): the scene from the portal's file store into the ``scene``
  volume, checked against the checksum unpacking recorded (``sessions.render.podfiles``);
- ``blender`` (the render image): Blender's command as the Docker sandbox runs it, the slice's resource and
  limits, the scene read-only, ``/out`` its one writable folder (bounded by the volume's size limit, past which
  the kubelet evicts the pod: the output watchdog's bound) and a small ``/tmp`` in memory; no token;
- ``give-back`` (a sidecar, the portal's image): after Blender ends, every frame back to the portal.

The file-store containers alone mount the run's Secret: one token the portal signed for this job and run,
lasting until the Job's deadline (``sessions.render.portalstore.sign_for_run``), never the portal's key. The
pods share a network namespace, so the render pods' NetworkPolicy lets them reach the portal's web pods alone
(its file store), and nothing reaches them.

Not bounded here as on a Docker host: a container's process count (Kubernetes bounds it per node, the kubelet's
``podPidsLimit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessions.runtime.blender import OUTPUT_DIR, RENDER_UID, SCENE_DIR
from sessions.runtime.kube.manifests import CONTAINER_SECURITY, POD_SECURITY, dns_egress, label_value, network_policy
from sessions.runtime.kube.slices import DEVICE_PLUGIN, DRA, WAYS, KubeSlice
from sessions.runtime.spec import Limits

STAGING_S = 900  # a run's scene fetched and its frames given back, besides Blender's wall time
GIVE_BACK_S = 300  # how long the give-back sidecar has once Blender ended (the pod's grace period)
KEPT_AFTER_S = 3600  # the cluster removes an ended Job (and its pod) this long after; the worker read it by then
PORTAL_UID = 10001  # the portal image's `portal` user (compose/images/portal/Dockerfile)
TMP = "/tmp"  # noqa: S108 (the pod's own volume, in memory)
TMP_SIZE = "512Mi"
TOKEN_DIR = "/run/gpu-portal"  # noqa: S105 (a folder: the run's Secret, mounted)
RENDER_POD = {"app.kubernetes.io/name": "gpu-portal", "app.kubernetes.io/component": "render-run"}
PORTAL_WEB_POD = {"app.kubernetes.io/name": "gpu-portal", "app.kubernetes.io/component": "web"}
FILE_CONTAINER_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}


@dataclass(frozen=True)
class RenderRun:
    """One attempt at a chunk: its job, the run's name (its output folder's, ``chunk<index>-<attempt>``),
    Blender's command as the sandbox runs it (``sessions.runtime.blender.render_command``), the slice's limits,
    the scene's checksum and size, the most its output may hold, Blender's wall time and the portal's labels."""

    job: int
    run: str
    command: tuple[str, ...]
    limits: Limits
    scene_sha256: str
    scene_bytes: int
    output_bytes: int
    wall_time_s: int
    labels: Mapping[str, str]

    def __post_init__(self) -> None:
        if not self.run or label_value(self.run) != self.run or len(self.name) > 63:
            raise ValueError(f"a run's name is a short plain name such as chunk0-1 (got {self.run!r})")
        if min(self.scene_bytes, self.output_bytes, self.wall_time_s) <= 0:
            raise ValueError("a run's scene, output and wall time are bounded by positive figures")

    @property
    def name(self) -> str:
        """The Job's name, its Secret's and (with DRA) its claim's stem: lower case, as Kubernetes names are."""
        return f"gpu-portal-render-{self.job}-{self.run}".lower().replace("_", "-").replace(".", "-")

    @property
    def deadline_s(self) -> int:
        return self.wall_time_s + STAGING_S

    def pod_labels(self) -> dict[str, str]:
        return {**{key: label_value(value) for key, value in self.labels.items()}, **RENDER_POD}


@dataclass(frozen=True)
class Images:
    render: str  # Blender's (compose/bin/build-render-image)
    portal: str  # the portal's, which holds ``sessions.render.podfiles``


def _hardened(user: int) -> dict[str, Any]:
    return {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True, "runAsUser": user, "runAsGroup": user}


def _file_container(
    name: str, image: str, args: list[str], mounts: list[dict[str, Any]], env: list[dict[str, str]]
) -> dict[str, Any]:
    """A container of the portal's image that runs ``sessions.render.podfiles``, the run's token mounted."""
    return {
        "name": name,
        "image": image,
        "command": ["python", "-m", "sessions.render.podfiles", *args],
        "env": env,
        "volumeMounts": [*mounts, {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True}],
        "resources": FILE_CONTAINER_RESOURCES,
        "securityContext": _hardened(PORTAL_UID),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def render_job(
    run: RenderRun, taken: KubeSlice, way: str, *, namespace: str, images: Images, store_url: str, part_bytes: int
) -> dict[str, Any]:
    """The Job of one run on the slice ``taken``, asked for the ``way`` given (the device plugin or DRA; with
    DRA its claim is ``taken.resource_claim(run.name, ...)``, made first)."""
    if way not in WAYS:
        raise ValueError(f"a slice is asked for by one of {', '.join(WAYS)} (got {way!r})")
    env = [
        {"name": "GPU_PORTAL_FILE_STORE_URL", "value": store_url},
        {"name": "GPU_PORTAL_JOB", "value": str(run.job)},
        {"name": "GPU_PORTAL_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},
        {"name": "GPU_PORTAL_PART_BYTES", "value": str(part_bytes)},
    ]
    fetch = _file_container(
        "fetch",
        images.portal,
        ["fetch", "--into", SCENE_DIR, "--most-bytes", str(run.scene_bytes)],
        [{"name": "scene", "mountPath": SCENE_DIR}],
        [*env, {"name": "GPU_PORTAL_SCENE_SHA256", "value": run.scene_sha256}],
    )
    give_back = _file_container(
        "give-back",
        images.portal,
        ["give-back", "--from", OUTPUT_DIR, "--run", run.run],
        [{"name": "out", "mountPath": OUTPUT_DIR, "readOnly": True}],
        env,
    )
    give_back["restartPolicy"] = "Always"  # a sidecar: it runs beside Blender and is told to end after it
    resources: dict[str, Any] = {
        "limits": {"cpu": str(run.limits.cpus), "memory": str(run.limits.memory_bytes)},
        "requests": {"cpu": str(run.limits.cpus), "memory": str(run.limits.memory_bytes)},
    }
    if way == DEVICE_PLUGIN:
        resources["limits"].update(taken.limits())
        resources["requests"].update(taken.limits())
    else:
        resources["claims"] = taken.container_claims()
    blender = {
        "name": "blender",
        "image": images.render,
        "command": list(run.command),
        "workingDir": TMP,
        "env": [{"name": "HOME", "value": TMP}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": resources,
        "volumeMounts": [
            {"name": "scene", "mountPath": SCENE_DIR, "readOnly": True},
            {"name": "out", "mountPath": OUTPUT_DIR},
            {"name": "tmp", "mountPath": TMP},
        ],
        "securityContext": _hardened(RENDER_UID),
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {**POD_SECURITY, "runAsUser": RENDER_UID, "runAsGroup": RENDER_UID, "fsGroup": RENDER_UID},
        "terminationGracePeriodSeconds": GIVE_BACK_S,
        "affinity": taken.node_affinity(),
        "initContainers": [fetch, give_back],
        "containers": [blender],
        "volumes": [
            {"name": "scene", "emptyDir": {"sizeLimit": str(run.scene_bytes)}},
            {"name": "out", "emptyDir": {"sizeLimit": str(run.output_bytes)}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": TMP_SIZE}},
            {"name": "token", "secret": {"secretName": run.name, "defaultMode": 0o440}},
        ],
    }
    if way == DRA:
        pod["resourceClaims"] = taken.pod_claims(run.name)
    labels = run.pod_labels()
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": run.name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": run.deadline_s,
            "ttlSecondsAfterFinished": KEPT_AFTER_S,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def run_secret(run: RenderRun, namespace: str, token: str) -> dict[str, Any]:
    """The run's token, which only its file-store containers mount."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": run.name, "namespace": namespace, "labels": run.pod_labels()},
        "type": "Opaque",
        "immutable": True,
        "stringData": {"token": token},
    }


def render_network_policy(namespace: str, portal_port: int) -> dict[str, Any]:
    """The render pods' fence: out, the portal's web pods alone, on its port (its file store), and the cluster's
    DNS to find them; in, nothing. Blender shares the pod's network with the file-store containers, so this is
    what a hostile scene could reach: the portal's public pages, and with no token, none of its files."""
    to_portal = {
        "to": [{"podSelector": {"matchLabels": dict(PORTAL_WEB_POD)}}],
        "ports": [{"protocol": "TCP", "port": portal_port}],
    }
    return network_policy("gpu-portal-render-runs", namespace, RENDER_POD, [], [to_portal, dns_egress()])
