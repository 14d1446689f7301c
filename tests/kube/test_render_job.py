# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A render chunk's run as a Kubernetes Job (issue 34, item 2).

The Job, its Secret, its claim and the render pods' network policy are checked against the API's OpenAPI schema
(kubernetes-validate, strict), for MIG, whole-GPU and shared slices asked for both ways, made from a chunk and
the slice the allocator chose. The Job's own file-store containers (``sessions.render.podfiles``) run here as
processes, as the pod would run them, against the portal under daphne: the scene fetched and checked, the frames
given back on the sidecar's SIGTERM, and every refusal. No cluster ran the Job: that the kubelet starts the
sidecar before Blender and ends it after, and evicts the pod past its output volume's size, is Kubernetes' part
(sidecar containers are stable since 1.33), not shown here."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.render import containers, kubejobs
from sessions.render.models import RenderChunk, RenderJob
from sessions.render.portalstore import sign_for_run, signed_host
from sessions.render.services import render_settings
from sessions.runtime import blender
from sessions.runtime.kube.jobs import (
    GIVE_BACK_S,
    STAGING_S,
    Images,
    RenderRun,
    render_job,
    render_network_policy,
    run_secret,
)
from sessions.runtime.kube.slices import DEVICE_PLUGIN, DRA, WAYS
from sessions.runtime.render import RENDER_IMAGE
from sessions.runtime.slices import spec_for
from sessions.runtime.spec import Limits
from tests.helpers.processes import ROOT
from tests.kube.test_specs import KUBERNETES, NAMESPACE, SLICES
from tests.render.stack import make_job, render_portal_server, render_root  # noqa: F401 (fixtures)

IMAGES = Images(render="gpu-portal/render:latest", portal="gpu-portal/portal:latest")
STORE = "http://gpu-portal-web.gpu-portal.svc:8002"
RESOURCES = {"mig": "nvidia.com/mig-1g.18gb", "whole": "nvidia.com/gpu", "shared": "nvidia.com/gpu.shared"}


def valid(manifest: dict[str, Any]) -> dict[str, Any]:
    kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    return manifest


def a_run(**changed: Any) -> RenderRun:
    given: dict[str, Any] = {
        "job": 41,
        "run": "chunk0-1",
        "command": ("blender", "-b", "/scene/scene.blend", "-f", "1..2"),
        "limits": Limits(4.0, 16 * 2**30, 2048),
        "scene_sha256": "ab" * 32,
        "scene_bytes": 3 * 2**20,
        "output_bytes": 2 * 2**30,
        "wall_time_s": 3600,
        "labels": {"gpu-portal.instance": "a1b2c3", "gpu-portal.holder": "render:41"},
    }
    return RenderRun(**{**given, **changed})


def containers_of(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    pod = job["spec"]["template"]["spec"]
    return {container["name"]: container for container in [*pod["initContainers"], *pod["containers"]]}


def mounts_of(container: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {mount["name"]: (mount["mountPath"], bool(mount.get("readOnly"))) for mount in container["volumeMounts"]}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("kind", sorted(SLICES))
def test_a_run_is_a_job_pinned_to_the_chosen_slice_that_runs_once_within_a_deadline(kind: str, way: str) -> None:
    taken, run = SLICES[kind], a_run()
    job = valid(render_job(run, taken, way, namespace=NAMESPACE, images=IMAGES, store_url=STORE, part_bytes=2**20))
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 3600 + STAGING_S), "once; the portal re-queues"
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == GIVE_BACK_S
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In", "values": [taken.node]}]
    blender_container = containers_of(job)["blender"]
    assert blender_container["command"] == list(run.command) and blender_container["image"] == IMAGES.render
    resources = blender_container["resources"]
    assert resources["limits"]["cpu"] == "4.0" and resources["limits"]["memory"] == str(16 * 2**30)
    if way == DEVICE_PLUGIN:
        assert resources["limits"][RESOURCES[kind]] == resources["requests"][RESOURCES[kind]] == "1"
        assert "resourceClaims" not in pod
    else:
        assert not {name for name in resources["limits"] if name.startswith("nvidia.com/")}
        assert resources["claims"] == [{"name": "gpu"}]
        claim = valid(taken.resource_claim(run.name, NAMESPACE, run.pod_labels()))
        assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]
        selector = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
        assert taken.device_uuid in selector


def test_no_container_of_the_run_is_root_or_holds_a_cluster_token_and_blender_never_sees_the_runs_token() -> None:
    run = a_run()
    job = valid(render_job(run, SLICES["mig"], DEVICE_PLUGIN, namespace=NAMESPACE, images=IMAGES, store_url=STORE,
                           part_bytes=2**20))  # fmt: skip
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    found = containers_of(job)
    assert list(found) == ["fetch", "give-back", "blender"]
    for name, container in found.items():
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False, name
        assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"] is True, name
        assert security["runAsUser"] not in (0, None), name
    tmp = "/tmp"  # noqa: S108 (the pod's own, in memory)
    assert mounts_of(found["blender"]) == {"scene": ("/scene", True), "out": ("/out", False), "tmp": (tmp, False)}
    assert mounts_of(found["fetch"]) == {"scene": ("/scene", False), "token": ("/run/gpu-portal", True)}
    assert mounts_of(found["give-back"]) == {"out": ("/out", True), "token": ("/run/gpu-portal", True)}
    assert found["give-back"]["restartPolicy"] == "Always", "a sidecar: beside Blender, ended after it"
    assert "restartPolicy" not in found["fetch"], "an init container: Blender starts once the scene is here"
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["out"]["emptyDir"] == {"sizeLimit": str(2 * 2**30)}, "the output bound: evicted past it"
    assert volumes["token"]["secret"]["secretName"] == run.name
    secret = valid(run_secret(run, NAMESPACE, "a-token"))
    assert secret["metadata"]["name"] == run.name and secret["stringData"] == {"token": "a-token"}
    environment = {item["name"]: item["value"] for item in found["fetch"]["env"]}
    assert environment["GPU_PORTAL_SCENE_SHA256"] == run.scene_sha256 and environment["GPU_PORTAL_JOB"] == "41"
    assert job["metadata"]["labels"]["gpu-portal.holder"] == "render-41"


def test_render_pods_reach_the_portals_web_pods_alone_and_nothing_reaches_them() -> None:
    policy = valid(render_network_policy(NAMESPACE, portal_port=8002))
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "render-run"
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    to_portal, to_dns = spec["egress"]
    assert to_portal["to"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpu-portal", "app.kubernetes.io/component": "web"}}}
    ]
    assert to_portal["ports"] == [{"protocol": "TCP", "port": 8002}]
    assert {port["port"] for port in to_dns["ports"]} == {53}


def test_a_run_kubernetes_cannot_be_given_is_refused_naming_why() -> None:
    with pytest.raises(ValueError, match="plain name such as chunk0-1"):
        a_run(run="chunk 0/1")
    with pytest.raises(ValueError, match="bounded by positive figures"):
        a_run(output_bytes=0)
    with pytest.raises(ValueError, match="one of device-plugin, dra"):
        render_job(a_run(), SLICES["whole"], "mps", namespace=NAMESPACE, images=IMAGES, store_url=STORE, part_bytes=1)


# -- made from a chunk and the allocator's slice --------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
def test_the_objects_of_a_chunks_run_come_from_the_allocators_slice_and_the_sandboxs_spec(
    way: str, fleet: None, alice: User, render_root: Path, tmp_path: Path
) -> None:
    scene = tmp_path / "scene.blend"
    scene.write_bytes(b"BLENDER-v402 not really a scene" * 100)
    job = make_job(alice, scene, [1, 2, 3], RenderJob.State.QUEUED, chunk_size=3, samples=8)
    chunk = RenderChunk.objects.create(job=job, index=0, frames=[1, 2, 3], attempts=1)
    for request, node, kind in (
        (SliceRequest("mig", "1g.10gb", host="gpu-node-2"), "gpu-node-2", "mig"),
        (SliceRequest("whole", host="gpu-node-3"), "gpu-node-3", "whole"),
    ):
        taken = allocate(alice, request, holder=Holder.render(job.pk))
        spec = spec_for(taken, RENDER_IMAGE, labels=containers.labels(job.pk, chunk.pk))
        mark = blender.new_mark()
        command = blender.render_command("scene.blend", (1, 2, 3), render_settings(job, taken), mark, 2)
        run = kubejobs.run_of(job, kubejobs.run_name(chunk), spec, command, 2**30, 3600)
        made = kubejobs.objects_of(run, taken, way=way, namespace=NAMESPACE)
        for manifest in made.in_order():
            valid(manifest)
        claimed = ["ResourceClaim"] if way == DRA else []
        assert [item["kind"] for item in made.in_order()] == ["Secret", *claimed, "Job"]
        sliced = kubejobs.kube_slice(taken)
        assert (sliced.kind, sliced.node, sliced.device_uuid) == (kind, node, taken.device_uuid)
        blender_container = containers_of(made.job)["blender"]
        assert blender_container["command"] == command and blender_container["image"] == "gpu-portal/render:latest"
        assert json.loads(command[-1])["samples"] == 8 and mark in command[-1], "the job's settings, our mark"
        assert blender_container["resources"]["limits"]["cpu"] == str(spec.limits.cpus)
        assert made.job["metadata"]["name"] == f"gpu-portal-render-{job.pk}-chunk0-1"
        assert made.job["metadata"]["labels"]["gpu-portal.render_job"] == str(job.pk)
        assert run.scene_sha256 == job.scene_sha256 and run.scene_bytes == scene.stat().st_size
        token = made.secret["stringData"]["token"]
        assert signed_host(token, job.pk) == "run:chunk0-1" and signed_host(token, job.pk + 1) is None


def test_a_runs_token_lasts_until_its_deadline_and_no_longer(alice: User, transactional_db: None) -> None:
    assert signed_host(sign_for_run(7, "chunk0-1", 60), 7) == "run:chunk0-1"
    assert signed_host(sign_for_run(7, "chunk0-1", -1), 7) is None, "past its deadline"
    assert signed_host(sign_for_run(7, "chunk0-1", 60) + "x", 7) is None


# -- the Job's own file-store containers, against the portal ---------------------------------------------------


def podfiles(*args: str, env: dict[str, str], **options: Any) -> subprocess.CompletedProcess[str]:
    """``python -m sessions.render.podfiles`` as the pod runs it: no Django settings, no key."""
    return subprocess.run(
        [sys.executable, "-m", "sessions.render.podfiles", *args],
        env={"PATH": os.environ["PATH"], **env}, cwd=ROOT, capture_output=True, text=True, timeout=60, **options,
    )  # fmt: skip


def pod_env(server: str, job: RenderJob, tmp_path: Path, token: str, part_bytes: int = 1000) -> dict[str, str]:
    token_file = tmp_path / "token"
    token_file.write_text(token)
    return {
        "GPU_PORTAL_FILE_STORE_URL": server,
        "GPU_PORTAL_JOB": str(job.pk),
        "GPU_PORTAL_TOKEN_FILE": str(token_file),
        "GPU_PORTAL_PART_BYTES": str(part_bytes),
        "GPU_PORTAL_SCENE_SHA256": job.scene_sha256,
        "GPU_PORTAL_TERMINATION_LOG": str(tmp_path / "termination-log"),
    }


@pytest.fixture
def scene_job(alice: User, render_root: Path, tmp_path: Path, transactional_db: None) -> RenderJob:
    scene = tmp_path / "upload.blend"
    scene.write_bytes(os.urandom(2500))
    return make_job(alice, scene, [1, 2], RenderJob.State.RENDERING)


def test_the_fetch_container_brings_the_checked_scene_and_refuses_any_other(
    render_portal_server: str, scene_job: RenderJob, tmp_path: Path
) -> None:
    job, into = scene_job, tmp_path / "scene"
    into.mkdir()
    env = pod_env(render_portal_server, job, tmp_path, sign_for_run(job.pk, "chunk0-1", 600))
    fetched = podfiles("fetch", "--into", str(into), "--most-bytes", "10000", env=env)
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads(fetched.stdout) == {"fetched": 2500}
    assert (into / "scene.blend").read_bytes() == (job.scene_path() / "scene.blend").read_bytes()

    for attempt, (what, changed, args) in enumerate(
        (
            ("another scene", {"GPU_PORTAL_SCENE_SHA256": "00" * 32}, []),
            ("larger than this run may fetch", {}, ["--most-bytes", "100"]),
            ("refused GET scene/: 403", {"GPU_PORTAL_JOB": str(job.pk + 1000)}, []),
        )
    ):
        elsewhere = tmp_path / f"scene-{attempt}"
        elsewhere.mkdir()
        refused = podfiles("fetch", "--into", str(elsewhere), "--most-bytes", "10000", *args, env={**env, **changed})
        assert refused.returncode == 1 and what in refused.stderr, refused.stderr
        assert what in (tmp_path / "termination-log").read_text(), "the kubelet's termination message says why"
    no_token = podfiles("fetch", "--into", str(into), "--most-bytes", "1", env={"GPU_PORTAL_JOB": "1"})
    assert no_token.returncode == 1 and "not set up as a render Job's" in no_token.stderr


def test_the_give_back_sidecar_sends_the_frames_when_told_to_end_and_nothing_else(
    render_portal_server: str, scene_job: RenderJob, tmp_path: Path
) -> None:
    job, output = scene_job, tmp_path / "out"
    output.mkdir()
    frame = os.urandom(2500)  # three parts of at most 1000 bytes
    (output / "frame_000001.png").write_bytes(frame)
    (output / "frame_000002.png").write_bytes(b"")
    (output / "escape.png").symlink_to("/etc/passwd")
    (output / "folder").mkdir()
    env = pod_env(render_portal_server, job, tmp_path, sign_for_run(job.pk, "chunk0-1", 600))

    sidecar = subprocess.Popen(
        [sys.executable, "-m", "sessions.render.podfiles", "give-back", "--from", str(output), "--run", "chunk0-1"],
        env={"PATH": os.environ["PATH"], **env}, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)
    assert sidecar.poll() is None, "it waits beside Blender until the kubelet tells it to end"
    assert not (job.folder_path() / "frames" / "chunk0-1").exists()
    sidecar.send_signal(signal.SIGTERM)
    out, err = sidecar.communicate(timeout=60)
    assert sidecar.returncode == 0, err
    said = [json.loads(line) for line in out.splitlines()]
    kept = {item["kept"]: item for item in said if "kept" in item}
    assert set(kept) == {"frames/chunk0-1/frame_000001.png", "frames/chunk0-1/frame_000002.png"}
    assert kept["frames/chunk0-1/frame_000001.png"]["sha256"] == hashlib.sha256(frame).hexdigest()
    assert {item["skipped"] for item in said if "skipped" in item} == {"escape.png", "folder"}
    assert (job.folder_path() / "frames" / "chunk0-1" / "frame_000001.png").read_bytes() == frame
    assert (job.folder_path() / "frames" / "chunk0-1" / "frame_000002.png").read_bytes() == b""

    other_run = podfiles("give-back", "--from", str(output), "--run", "../x", "--now", env=env)
    assert other_run.returncode == 2 and "plain name" in other_run.stderr
    expired = {**env, "GPU_PORTAL_TOKEN_FILE": str(tmp_path / "old")}
    (tmp_path / "old").write_text(sign_for_run(job.pk, "chunk0-1", -1))
    refused = podfiles("give-back", "--from", str(output), "--run", "chunk0-2", "--now", env=expired)
    assert refused.returncode == 1 and "403" in refused.stderr
    assert not (job.folder_path() / "frames" / "chunk0-2").exists()


def test_a_portal_process_loads_the_clusters_client_only_where_a_kube_host_needs_it() -> None:
    """Every program of the portal starts without the Kubernetes client (its import is heavy, and it reads a
    kube-config as it loads): only a kube:// host's work loads it."""
    code = (
        "import django, sys; django.setup(); import portal.urls, portal.celery, sessions.render.tasks, "
        "sessions.notebooks.tasks, sessions.storage.tasks; print(sorted(name for name in sys.modules "
        "if name.split('.')[0] in ('kubernetes_asyncio', 'kubespawner')))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip().splitlines()[-1] == "[]"
