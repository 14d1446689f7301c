"""A chunk's run on a slice of a Kubernetes node, as the cluster is asked for it (``sessions.runtime.kube.jobs``):
made from the allocator's decision (the slice), the job's settings and its owner's quota, as a Docker host's
run is (``sessions.render.chunks``): the same Blender command, limits, labels, wall time and output bound.

What is made here: the run's Secret (its token), its claim where the slice is asked for by DRA, and its Job.
Not here yet: a render worker that creates them through the cluster's API and follows the Job (Blender's lines
from the pod's log, its frames from the give-back container's); render chunks run on Docker hosts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from sessions.gpus.models import Slice
from sessions.render import containers, filestore, storage
from sessions.render.models import RenderChunk, RenderJob
from sessions.render.portalstore import sign_for_run
from sessions.render.services import render_settings
from sessions.runtime import blender
from sessions.runtime.kube.jobs import Images, RenderRun, render_job, run_secret
from sessions.runtime.kube.slices import DRA, KubeSlice
from sessions.runtime.render import RENDER_IMAGE
from sessions.runtime.slices import spec_for

PORTAL_IMAGE = "gpu-portal/portal:latest"  # built by compose/bin/build-stack-images


@dataclass(frozen=True)
class Objects:
    """What one run asks the cluster for, in the order they are made."""

    secret: dict[str, Any]
    claim: dict[str, Any] | None
    job: dict[str, Any]
    mark: str  # what marks our own lines in Blender's output, which the worker following the Job reads

    def in_order(self) -> list[dict[str, Any]]:
        return [self.secret, *([self.claim] if self.claim else []), self.job]


def kube_slice(taken: Slice) -> KubeSlice:
    """The allocator's decision in the cluster's words: the node is the GPU host's name."""
    return KubeSlice(taken.kind, taken.profile, taken.gpu.host.name, taken.gpu.uuid, taken.device_uuid)


def run_of(job: RenderJob, chunk: RenderChunk, taken: Slice, mark: str) -> RenderRun:
    """The chunk's next attempt on ``taken``: the command and bounds a Docker host's run would have. ValueError
    where the owner's quota leaves no room for its output (no run starts then, as on a Docker host)."""
    bound = storage.output_bound(job.owner_id)
    if bound.limit <= 0:
        raise ValueError(bound.exceeded())
    spec = spec_for(taken, RENDER_IMAGE, labels=containers.labels(job.pk, chunk.pk))
    threads = max(1, math.ceil(spec.limits.cpus))
    command = blender.render_command(job.main_file, tuple(chunk.frames), render_settings(job, taken), mark, threads)
    scene_bytes = sum(info.st_size for _, info in filestore.plain_files(job.scene_path()))
    return RenderRun(
        job=job.pk,
        run=f"chunk{chunk.index}-{chunk.attempts}",
        command=tuple(command),
        limits=spec.limits,
        scene_sha256=job.scene_sha256,
        scene_bytes=max(1, scene_bytes),
        output_bytes=bound.limit,
        wall_time_s=settings.RENDER_CHUNK_WALL_SECONDS,
        labels=spec.labels,
    )


def objects_for(
    job: RenderJob, chunk: RenderChunk, taken: Slice, *, way: str, namespace: str, store_url: str, images: Images
) -> Objects:
    """The run's Secret, claim (DRA only) and Job; ValueError where the run cannot start (``run_of``) or the
    slice cannot be asked for."""
    mark = blender.new_mark()
    run = run_of(job, chunk, taken, mark)
    sliced = kube_slice(taken)
    claim = sliced.resource_claim(run.name, namespace, run.pod_labels()) if way == DRA else None
    made = render_job(
        run, sliced, way, namespace=namespace, images=images, store_url=store_url,
        part_bytes=settings.RENDER_UPLOAD_PART_BYTES,
    )  # fmt: skip
    secret = run_secret(run, namespace, sign_for_run(job.pk, run.run, run.deadline_s))
    return Objects(secret, claim, made, mark)


def default_images() -> Images:
    return Images(render=RENDER_IMAGE, portal=PORTAL_IMAGE)
