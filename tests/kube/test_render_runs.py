# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A render chunk on a Kubernetes node (issue 34, item 2), through the portal's render worker code: a GPU host whose
engine is ``kube://NAMESPACE`` renders a chunk as a Job on the in-memory API server, which the Job kubelet
(tests/kube/job_kubelet.py) runs for real: the scene fetched from the portal under daphne by the Job's init
container, Blender in the render image on the Docker engine, the frames given back by its sidecar. The worker
follows Blender's lines from the pod's log, holds the slice from Blender's start, records the frames (with their
thumbnails) once the pod ended, and removes the run's Job and Secret."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from kubernetes_asyncio.client import ApiClient, BatchV1Api, Configuration, CoreV1Api, ResourceV1Api
from PIL import Image
from pytest_django.fixtures import Settings

from billing import seeds
from billing.models import Price
from sessions.gpus.models import Slice
from sessions.render import chunks, queues, recovery, services, stopping
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.gpus.conftest import use_fleet
from tests.kube.cluster import NAMESPACE, Cluster, in_thread
from tests.kube.job_kubelet import LOGS, JobKubelet
from tests.render.stack import (  # noqa: F401 (fixtures)
    make_job,
    queued_as_one_chunk,
    render_image,
    render_portal_server,
    render_root,
    scenes,
)

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.fixture
def kube_host(settings: Settings, render_root: Path, render_portal_server: str, cluster: Cluster) -> Iterator[None]:
    """One GPU host, gpu-node-2, whose engine is the cluster's namespace; the portal answers its file store."""
    use_fleet(settings, "gpu-node-2: 1xH200:mig")
    seeds.ensure(Price)  # a transactional test starts from an empty table
    settings.RENDER_DIR = render_root
    settings.DOCKER_ENGINES = {"gpu-node-2": f"kube://{NAMESPACE}"}
    settings.KUBERNETES_API = cluster.url
    settings.FILE_STORE_URL = render_portal_server
    settings.RENDER_CHUNK_ATTEMPTS = 1
    taken_by_the_suites_render_worker("gpu-node-2")
    yield


def taken_by_the_suites_render_worker(host: str) -> None:
    """A render worker the suite started earlier (tests/render/stack.py) takes the render queue of every simulated
    host it finds whose engine is its machine's (in its own settings, gpu-node-2's is), first sending that host's
    recovery, which puts back a chunk rendering there. Here the test process renders on gpu-node-2 itself: the
    worker's take, and its recovery, come first, or it would put the test's chunk back mid-run."""
    deadline = time.monotonic() + 15  # it looks every 2 s; one that serves named hosts alone never takes it
    while time.monotonic() < deadline:
        read = queues.hosts_read()
        if not read:  # no render worker runs: nobody takes the host
            return
        if host in read:  # taken: its recovery was sent first, and finds nothing rendering there
            time.sleep(2)
            return
        time.sleep(0.5)


@pytest.fixture
async def job_kubelet(cluster: Cluster) -> AsyncIterator[JobKubelet]:
    LOGS.lines.clear()
    LOGS.ended.clear()
    runner = JobKubelet(cluster.url, NAMESPACE, LOGS)
    stop = asyncio.Event()
    serving = asyncio.ensure_future(runner.serve(stop))
    yield runner
    stop.set()
    await serving


def frames_of(job: RenderJob) -> list[RenderFrame]:
    return list(RenderFrame.objects.filter(job=job).order_by("number"))


async def objects_left(cluster: Cluster) -> dict[str, list[str]]:
    """The run objects the namespace holds: a run's Job, Secret and own claim go with it."""
    async with ApiClient(Configuration(host=cluster.url)) as client:
        jobs = [job.metadata.name for job in (await BatchV1Api(client).list_namespaced_job(NAMESPACE)).items]
        secrets = [item.metadata.name for item in (await CoreV1Api(client).list_namespaced_secret(NAMESPACE)).items]
        claims = (await ResourceV1Api(client).list_namespaced_resource_claim(NAMESPACE)).items
        return {"jobs": jobs, "secrets": secrets, **({"claims": [c.metadata.name for c in claims]} if claims else {})}


@pytest.mark.parametrize("way", ["device-plugin", "dra"])
async def test_a_chunk_on_a_kube_host_renders_as_a_job_and_its_frames_come_back(
    way: str, kube_host: None, job_kubelet: JobKubelet, cluster: Cluster, scenes: Path, alice: User, settings: Any
) -> None:
    settings.KUBERNETES_SLICE_REQUEST = way
    job, held = await in_thread(queued_as_one_chunk, alice, scenes / "small.blend", [1, 2, 3], (64, 48))

    await in_thread(chunks.work_on_slice, job.pk, held.pk)

    job = await in_thread(lambda: RenderJob.objects.get(pk=job.pk))
    assert job.state == RenderJob.State.DONE, job.failure_message
    frames = await in_thread(frames_of, job)
    assert [frame.state for frame in frames] == [RenderFrame.State.DONE] * 3
    for frame in frames:
        kept = job.folder_path() / frame.output_path
        assert frame.output_path.startswith("frames/chunk0-1/"), "the run's output folder, as on a Docker host"
        assert hashlib.sha256(kept.read_bytes()).hexdigest() == frame.sha256
        with Image.open(kept) as image:
            assert (image.format, image.size) == ("PNG", (64, 48))
        assert (job.folder_path() / frame.thumbnail_path).is_file(), "made here from the frame given back"
    (job_name,) = job_kubelet.seen
    if way == "dra":  # the run's own claim was made before its Job, selecting the slice's device
        claim = job_kubelet.claims[job_name]
        assert claim["metadata"]["name"] == f"{job_name}-gpu"
        (request,) = claim["spec"]["devices"]["requests"]
        assert held.device_uuid in request["exactly"]["selectors"][0]["cel"]["expression"]
    pod_logs = {container: lines for (pod, container), lines in LOGS.lines.items() if pod.startswith(job_name)}
    assert any(b"Saved:" in line for line in pod_logs["blender"]), "Blender rendered in the Job's pod"
    kept_lines = [line for line in pod_logs["give-back"] if b'"kept"' in line]
    assert len(kept_lines) == 3, pod_logs["give-back"]
    taken = await in_thread(lambda: Slice.objects.get(pk=held.pk))
    assert taken.released_at is not None and taken.held_from is not None and taken.held_until is not None
    assert taken.held_from <= taken.held_until <= taken.released_at
    assert await objects_left(cluster) == {"jobs": [], "secrets": []}, "the run's objects are removed after it"


async def test_a_run_whose_scene_cannot_be_fetched_fails_its_attempt_saying_why_and_leaves_nothing(
    kube_host: None, job_kubelet: JobKubelet, cluster: Cluster, scenes: Path, alice: User, settings: Any
) -> None:
    settings.FILE_STORE_URL = "http://127.0.0.1:9"  # the portal as the pod would reach it: nothing answers there
    job, held = await in_thread(queued_as_one_chunk, alice, scenes / "small.blend", [1], (64, 48))

    await in_thread(chunks.work_on_slice, job.pk, held.pk)

    job = await in_thread(lambda: RenderJob.objects.get(pk=job.pk))
    assert job.state == RenderJob.State.FAILED
    assert "scene could not be fetched" in job.failure_message, job.failure_message
    taken = await in_thread(lambda: Slice.objects.get(pk=held.pk))
    assert taken.released_at is not None and taken.held_from is None, "Blender never started: nothing held"
    assert await objects_left(cluster) == {"jobs": [], "secrets": []}


async def test_a_cancelled_job_stops_its_run_on_the_node_and_its_charges_end_with_blender(
    kube_host: None, job_kubelet: JobKubelet, cluster: Cluster, scenes: Path, alice: User
) -> None:
    """The cancel finds the run by its labels and brings its Job's deadline to now: Blender is killed, the worker's
    run ends, the slice is held until Blender's end and released, and the run's objects go."""
    job, held = await in_thread(queued_as_one_chunk, alice, scenes / "endless.blend", [1, 2], (64, 48))
    rendering = asyncio.ensure_future(in_thread(chunks.work_on_slice, job.pk, held.pk))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while not any(container == "blender" and lines for (_, container), lines in LOGS.lines.items()):
        assert loop.time() < deadline and not rendering.done(), "Blender did not start in the Job's pod"
        await asyncio.sleep(0.2)

    # The periodic reconciliation finds the run by its labels on the node, running: nothing is put back,
    # however long ago the chunk began.
    await in_thread(lambda: RenderChunk.objects.filter(job=job).update(started_at=timezone.now() - timedelta(hours=1)))
    counts = await in_thread(recovery.reconcile)
    assert counts["chunks_put_back"] == 0 and counts["containers_removed"] == 0, counts
    assert await in_thread(lambda: RenderChunk.objects.get(job=job).state) == RenderChunk.State.RENDERING
    assert not rendering.done()

    await in_thread(stopping.cancel, job.pk)
    await asyncio.wait_for(rendering, 120)

    job = await in_thread(lambda: RenderJob.objects.get(pk=job.pk))
    assert job.state == RenderJob.State.CANCELLED
    taken = await in_thread(lambda: Slice.objects.get(pk=held.pk))
    assert taken.released_at is not None and taken.held_from is not None and taken.held_until is not None
    assert taken.held_until <= taken.released_at
    assert await objects_left(cluster) == {"jobs": [], "secrets": []}
    assert all(key in LOGS.ended for key in LOGS.lines if key[1] == "blender"), "Blender's container ended"


async def test_a_jobs_probe_on_a_kube_host_runs_as_a_job_and_estimates_it(
    kube_host: None, job_kubelet: JobKubelet, cluster: Cluster, scenes: Path, alice: User
) -> None:
    """The estimate's probe, on the job's own kind of slice, is a Job too: its frame given back to the probe's
    output folder, read there, and removed with it."""
    job = await in_thread(make_job, alice, scenes / "small.blend", [1, 2, 3], RenderJob.State.ESTIMATING)

    job = await in_thread(services.estimate, job.pk)

    assert job.state == RenderJob.State.AWAITING_CONFIRMATION, job.failure_message
    estimate = await in_thread(services.estimate_of, job)
    assert estimate is not None and estimate.device == "CPU" and estimate.seconds_per_frame > 0
    assert (estimate.facts["resolution_x"], estimate.facts["resolution_y"]) == (64, 48)
    (job_name,) = job_kubelet.seen
    assert "-probe-" in job_name
    (probe_slice,) = await in_thread(lambda: list(Slice.objects.filter(holder_id=job.pk)))
    assert probe_slice.released_at is not None and probe_slice.held_from is not None
    assert not (job.folder_path() / "frames").exists() or not any((job.folder_path() / "frames").iterdir())
    assert await objects_left(cluster) == {"jobs": [], "secrets": []}
