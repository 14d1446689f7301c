"""A chunk's run on a slice of a Kubernetes node (a GPU host whose engine is ``kube://NAMESPACE``), as the
cluster is asked for it (``sessions.runtime.kube.jobs``) and followed (``sessions.runtime.kube.runs``): made from
the allocator's decision (the slice), the sandbox's spec and Blender's command as a Docker host's run has them
(``sessions.render.chunks``), the job's scene and its owner's output bound.

What is made: the run's Secret (its token), its claim where the slice is asked for by DRA
(PORTAL_KUBERNETES_SLICE_REQUEST), and its Job, whose sidecar gives the frames back to the portal's file store
(PORTAL_FILE_STORE_URL, the portal as the cluster reaches it) into the run's output folder here."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from sessions.gpus.models import Slice
from sessions.render import containers, filestore
from sessions.render.models import RenderChunk, RenderJob
from sessions.render.portalstore import sign_for_run
from sessions.runtime import engines
from sessions.runtime.engine_config import KUBE
from sessions.runtime.kube.jobs import Images, RenderRun, render_job, run_secret
from sessions.runtime.kube.slices import DRA, KubeSlice
from sessions.runtime.spec import ContainerSpec

if TYPE_CHECKING:  # the cluster's client is loaded only where a kube:// host renders
    from sessions.runtime.kube.runs import JobRuntime


@dataclass(frozen=True)
class Objects:
    """What one run asks the cluster for, in the order they are made."""

    secret: dict[str, Any]
    claim: dict[str, Any] | None
    job: dict[str, Any]

    def in_order(self) -> list[dict[str, Any]]:
        return [self.secret, *([self.claim] if self.claim else []), self.job]


def run_name(chunk: RenderChunk) -> str:
    """A chunk's run's name: its output folder's (``sessions.render.chunks.output_folder``) and its Job's stem."""
    return f"chunk{chunk.index}-{chunk.attempts}"


def probe_run() -> str:
    """A probe's run's name: its own each time (a probe sent again is another run)."""
    return f"probe-{secrets.token_hex(3)}"


def kube_slice(taken: Slice) -> KubeSlice:
    """The allocator's decision in the cluster's words: the node is the GPU host's name."""
    return KubeSlice(taken.kind, taken.profile, taken.gpu.host.name, taken.gpu.uuid, taken.device_uuid)


def images() -> Images:
    return Images(render=settings.KUBERNETES_RENDER_IMAGE, portal=settings.KUBERNETES_PORTAL_IMAGE)


def run_of(
    job: RenderJob, run: str, spec: ContainerSpec, command: list[str], output_bytes: int, wall_time_s: int
) -> RenderRun:
    """One run of the job (a chunk's attempt, or its probe): the sandbox's spec and command, the job's scene, the
    output bound and Blender's wall time."""
    scene_bytes = sum(info.st_size for _, info in filestore.plain_files(job.scene_path()))
    return RenderRun(
        job=job.pk,
        run=run,
        command=tuple(command),
        limits=spec.limits,
        scene_sha256=job.scene_sha256,
        scene_bytes=max(1, scene_bytes),
        output_bytes=output_bytes,
        wall_time_s=wall_time_s,
        labels=spec.labels,
    )


def objects_of(run: RenderRun, taken: Slice, *, way: str, namespace: str) -> Objects:
    """The run's Secret, claim (DRA only) and Job on the slice ``taken``; ValueError for a slice Kubernetes
    cannot be asked for."""
    sliced = kube_slice(taken)
    claim = sliced.resource_claim(run.name, namespace, run.pod_labels()) if way == DRA else None
    made = render_job(
        run, sliced, way, namespace=namespace, images=images(), store_url=settings.FILE_STORE_URL,
        part_bytes=settings.RENDER_UPLOAD_PART_BYTES,
    )  # fmt: skip
    secret = run_secret(run, namespace, sign_for_run(run.job, run.run, run.deadline_s))
    return Objects(secret, claim, made)


def runtime_for(
    endpoint: str,
    job: RenderJob,
    run: str,
    taken: Slice,
    *,
    output_bytes: int,
    wall_time_s: int,
    may_start: Callable[[], bool] | None = None,
) -> JobRuntime:
    """The sandbox a run on a ``kube://`` host renders in (its output folder is ``output_for(job, run)``, where
    the give-back sidecar brings the frames): its start makes the run's objects."""
    from sessions.runtime.kube.runs import JobRuntime

    runtime = JobRuntime(endpoint, may_start=may_start)

    def make(spec: ContainerSpec, command: list[str]) -> list[dict[str, Any]]:
        made = run_of(job, run, spec, command, output_bytes, wall_time_s)
        return objects_of(made, taken, way=settings.KUBERNETES_SLICE_REQUEST, namespace=runtime.namespace).in_order()

    runtime.make = make
    return runtime


def watched_for(
    taken: Slice,
    job: RenderJob,
    run: str,
    *,
    output_bytes: int,
    wall_time_s: int,
    may_start: Callable[[], bool] | None = None,
) -> containers.Watched | JobRuntime:
    """What a run on the slice renders in: its host's Docker engine, or, on a ``kube://`` host, a Job there."""
    engine = engines.endpoint_of(taken.gpu.host.name)
    if not engine.startswith(KUBE):
        return containers.Watched(engine, may_start=may_start)
    return runtime_for(engine, job, run, taken, output_bytes=output_bytes, wall_time_s=wall_time_s, may_start=may_start)
