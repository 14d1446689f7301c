# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""Render chunks on many hosts (issue 32, item 3), on the lab: two hosts each run their own render worker
inside their namespace, reading their host's render queue alone, with no render folder of the portal's: each
fetches the job's scene from the portal's file store over its link, renders on its own engine (whose NVIDIA
stand-in refuses any other host's GPU), and gives the frames back the same way. One job's chunks run on both
hosts at once; afterwards every frame is the portal's, whole, and the invariants hold."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from sessions.gpus.holders import HolderKind
from sessions.gpus.models import Slice
from sessions.render import recovery, slices
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.runtime.render import RENDER_IMAGE
from tests.conftest import ARTIFACTS
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.waiting import wait_for
from tests.lab import invariants
from tests.lab.fleet import fleet_spec
from tests.lab.hosts import start_render_worker
from tests.lab.lab import Lab, Node
from tests.render.stack import (  # noqa: F401 (fixtures)
    make_job,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    with_estimate,
)

pytestmark = [
    pytest.mark.docker,
    pytest.mark.celery,
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(processes.test_database_url().startswith("sqlite"), reason="the lab hosts reach PostgreSQL"),
]
L4 = {"gpu_kind": "whole", "gpu_profile": "", "gpu_model": "L4-24GB"}  # one on each of n2 and n3


@pytest.fixture(scope="module")
def render_hosts(lab: Lab, render_image: str, portal_server: str) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """n2 and n3, each with the render image in its engine and its own render worker; by host name."""
    nodes = lab.nodes[1:]
    lab.load([RENDER_IMAGE], nodes)
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for node in nodes:
            workers[node.name] = start_render_worker(lab, node)
        yield workers
    finally:
        for worker in workers.values():
            processes.stop(worker)


def queued_on_l4s(owner: User, scene: Path, frames: list[int]) -> RenderJob:
    """A job queued as its confirmation queues it: chunks of two frames, up to two slices, whole L4s."""
    job = make_job(owner, scene, frames, RenderJob.State.QUEUED, chunk_size=2, max_slices=2, **L4)
    with_estimate(job, 64, 48)
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in frames])
    pairs = [frames[i : i + 2] for i in range(0, len(frames), 2)]
    RenderChunk.objects.bulk_create([RenderChunk(job=job, index=i, frames=pair) for i, pair in enumerate(pairs)])
    return job


def at_once(chunks: list[RenderChunk], one: str, other: str) -> bool:
    """Whether a chunk on host ``one`` and a chunk on host ``other`` rendered at the same time."""
    on = {name: [c for c in chunks if c.slice is not None and c.slice.gpu.host.name == name] for name in (one, other)}
    return any(
        a.started_at < b.finished_at and b.started_at < a.finished_at  # type: ignore[operator]
        for a in on[one]
        for b in on[other]
    )


def test_one_jobs_chunks_render_on_two_hosts_at_once_through_the_portals_file_store(
    lab: Lab,
    render_hosts: dict[str, subprocess.Popen[bytes]],
    render_stack: Path,
    scenes: Path,
    alice: User,
    prices: None,
    settings,
) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, fleet_spec(lab.name))
    n2, n3 = (node.name for node in lab.nodes[1:])
    job = queued_on_l4s(alice, scenes / "small.blend", list(range(1, 13)))

    assert slices.dispatch(job.pk) == 2, "one slice on each host's L4, each with its host's worker"
    job_done = lambda: RenderJob.objects.get(pk=job.pk).ended  # noqa: E731
    wait_for(job_done, 300, "the job to end")

    job.refresh_from_db()
    assert job.state == RenderJob.State.DONE, job.failure_message
    chunks = list(RenderChunk.objects.filter(job=job).select_related("slice__gpu__host"))
    hosts = {chunk.slice.gpu.host.name for chunk in chunks if chunk.slice is not None}
    assert hosts == {n2, n3}, f"the chunks ran on {hosts}"
    assert at_once(chunks, n2, n3), "a chunk on each host rendered at the same time"
    assert_frames_whole(job)

    held = Slice.objects.filter(holder_kind=HolderKind.RENDER, holder_id=job.pk, released_at__isnull=True)
    wait_for(lambda: not held.exists(), 60, "both slices released (each worker's last run over)")
    for node in lab.nodes[1:]:
        assert_rendered_away(node, job)
    invariants.check(lab)


def assert_frames_whole(job: RenderJob) -> None:
    """Every frame of the job, and its thumbnail, is in the job's folder, as its worker's checksum says."""
    for frame in RenderFrame.objects.filter(job=job):
        kept = job.folder_path() / frame.output_path
        assert hashlib.sha256(kept.read_bytes()).hexdigest() == frame.sha256, f"frame {frame.number} came back whole"
        assert (job.folder_path() / frame.thumbnail_path).is_file()


def assert_rendered_away(node: Node, job: RenderJob) -> None:
    """The host's worker fetched the scene (with the estimate) over its link into its own scratch, kept none of
    the frames there, and never made the portal's render folder."""
    log = (ARTIFACTS / "logs" / f"lab-render-{node.name}.log").read_text(errors="replace")
    assert f"render job {job.pk}: scene fetched from the portal" in log, f"{node.name} fetched the scene"
    scratch = node.folder / "scratch" / str(job.pk)
    kept = sorted(path.name for path in scratch.iterdir())
    assert kept == ["estimate.json", f"scene-{job.scene_sha256[:16]}"], "the host keeps the scene and estimate alone"
    assert not (node.folder / "no-render-folder").exists(), f"{node.name}'s worker made a render folder"


def test_a_render_worker_killed_mid_chunk_has_its_chunk_rendered_on_the_other_host(
    lab: Lab,
    render_hosts: dict[str, subprocess.Popen[bytes]],
    render_stack: Path,
    scenes: Path,
    alice: User,
    prices: None,
    settings,
) -> None:  # type: ignore[no-untyped-def]
    """The second host's render worker is killed (SIGKILL) while a chunk of a job renders there: reconciliation
    finds that no running worker reads that host's queue, stops the chunk's container on the host's engine,
    puts the chunk back without counting the attempt and releases the host's slice at its last proof of life;
    the third host's worker renders it, the job ends with every frame whole, and the invariants hold."""
    settings.RENDER_WORKER_SILENCE_S = 0  # at the first look that misses it (the default waits a minute)
    use_fleet(settings, fleet_spec(lab.name))
    second, third = lab.nodes[1:]
    job = queued_on_l4s(alice, scenes / "small.blend", list(range(1, 13)))
    assert slices.dispatch(job.pk) == 2
    on_second = RenderChunk.objects.filter(
        job=job, state=RenderChunk.State.RENDERING, slice__gpu__host__name=second.name
    )
    wait_for(on_second.exists, 180, f"a chunk rendering on {second.name}")
    cut_off = on_second.get()
    assert cut_off.slice_id is not None
    render_hosts[second.name].kill()
    render_hosts[second.name].wait(10)

    def put_back() -> bool:
        recovery.reconcile()  # as beat runs it
        return RenderChunk.objects.get(pk=cut_off.pk).slice_id != cut_off.slice_id or not on_second.exists()

    wait_for(put_back, 60, "the chunk of the killed worker put back")
    assert not Slice.objects.get(pk=cut_off.slice_id).active, "the killed worker's slice is released"
    left = lambda: second.docker("ps", "-aq", "--filter", f"label=gpu-portal.render_chunk={cut_off.pk}").split()  # noqa: E731
    assert left() == [], "its container stopped and removed on its host"

    def job_done() -> bool:
        recovery.reconcile()
        return RenderJob.objects.get(pk=job.pk).ended

    wait_for(job_done, 300, "the job to end on the other host")
    job.refresh_from_db()
    assert job.state == RenderJob.State.DONE, job.failure_message
    again = RenderChunk.objects.select_related("slice__gpu__host").get(pk=cut_off.pk)
    assert again.state == RenderChunk.State.DONE and again.slice is not None
    assert again.slice.gpu.host.name == third.name, "rendered on the host whose worker runs"
    assert again.attempts == 1, "the cut-off attempt is not counted against it"
    assert_frames_whole(job)
    held = Slice.objects.filter(holder_kind=HolderKind.RENDER, holder_id=job.pk, released_at__isnull=True)
    wait_for(lambda: recovery.reconcile() is not None and not held.exists(), 60, "the job's slices released")
    invariants.check(lab)
