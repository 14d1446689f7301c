# ruff: noqa: F811 (the fixtures imported from the test modules are parameters by name)
"""The lab's figures for ``python -m bench multihost --part lab`` (issue 32), measured through the lab's own
fixtures: this file is not collected with the tests (its name is not test_*), the bench runs it with pytest
and reads what it writes to PORTAL_BENCH_LAB_OUT.

- launch: a session's request to its JupyterLab answering through the public address (``/api``, 200), on the
  single-host path (this machine's hub and engine, PortalSpawner) against a remote lab host (the lab's hub,
  PortalSwarmSpawner, a service on the second host), interleaved, each stopped before the next;
- render: one job of 48 frames (chunks of 4) from its dispatch to its end, on one slice (one host) against two
  slices on two hosts at once, each host's render worker in its namespace, interleaved.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User

from portal.celery import app
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.holders import HolderKind
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session, stop_session
from sessions.render import slices
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.waiting import state_of, wait_for
from tests.lab.fleet import fleet_spec
from tests.lab.lab import TEST_LAB, Lab
from tests.lab.test_lab_notebooks import LAB_QUEUE, lab_hub, lab_hubs, lab_worker  # noqa: F401 (fixtures)
from tests.lab.test_lab_render import L4, render_hosts  # noqa: F401 (fixtures)
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
    pytest.mark.hub,
    pytest.mark.celery,
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(processes.test_database_url().startswith("sqlite"), reason="the lab hosts reach PostgreSQL"),
]
RUNS = int(os.environ.get("PORTAL_BENCH_LAB_RUNS", "3"))


def out(part: str, figures: dict[str, list[float]]) -> None:
    path = Path(os.environ.get("PORTAL_BENCH_LAB_OUT", "artifacts/bench-lab.json"))
    found = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**found, part: figures}, indent=1))


@contextlib.contextmanager
def through(queue: str, hub_api: str, settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """Launches and stops go to this queue's worker, which calls this hub."""
    kept_queue, kept_hub = app.conf.task_default_queue, settings.HUB_API_URL
    app.conf.task_default_queue, settings.HUB_API_URL = queue, hub_api
    try:
        yield
    finally:
        app.conf.task_default_queue, settings.HUB_API_URL = kept_queue, kept_hub


def launch_to_lab(alice: User, image: NotebookImage, request: SliceRequest, name: str, public: str) -> float:
    """Seconds from the launch to JupyterLab's /api answering through ``public``; the session stopped after."""
    began = time.monotonic()
    session = start_session(alice, Launch(request, image.pk, name))
    url = f"{public}/jupyter/user/{alice.username}/{name}/api"

    def answers() -> bool:
        if state_of(session) == NotebookSession.State.FAILED:
            raise AssertionError(session.failure_detail)
        try:
            answer = requests.get(url, timeout=5, allow_redirects=False)
        except requests.RequestException:
            return False
        # JupyterLab's own answer: its version, or its redirect to the hub's sign-in (no route yet: the hub's
        # own redirect to its spawn page)
        login = answer.status_code == 302 and "oauth2/authorize" in answer.headers.get("Location", "")
        return (answer.status_code == 200 and "version" in answer.text) or login

    wait_for(answers, 180, f"JupyterLab of {name}")
    took = time.monotonic() - began
    stop_session(session.pk, by=alice)
    wait_for(lambda: state_of(session) == NotebookSession.State.STOPPED, 90, f"{name} to stop")
    return took


def test_launch_on_a_remote_lab_host_against_the_single_host_path(
    lab: Lab, hub: str, lab_hub: str, lab_worker: str, notebook_image: NotebookImage, alice: User, prices: None,
    settings,  # type: ignore[no-untyped-def]
) -> None:  # fmt: skip
    use_fleet(settings, f"nb: 1xH200:mig, 1xL4:whole; {fleet_spec(TEST_LAB)}")  # notebook_image's and the lab's
    here, there = (
        SliceRequest("whole", model="L4", host="nb"),
        SliceRequest("whole", model="L4", host=lab.nodes[1].name),
    )
    figures: dict[str, list[float]] = {"single_host_s": [], "lab_host_s": []}
    for run in range(RUNS):
        figures["single_host_s"].append(launch_to_lab(alice, notebook_image, here, f"here{run}", hub))
        with through(LAB_QUEUE, f"{lab_hub}/jupyter/hub/api", settings):
            figures["lab_host_s"].append(launch_to_lab(alice, notebook_image, there, f"there{run}", lab_hub))
    out("launch", figures)


def render_48(alice: User, scene: Path, max_slices: int) -> float:
    """Seconds from the dispatch of a queued 48-frame job (chunks of 4) to its end, on ``max_slices`` L4s."""
    frames = list(range(1, 49))
    job = make_job(alice, scene, frames, RenderJob.State.QUEUED, chunk_size=4, max_slices=max_slices, **L4)
    with_estimate(job, 64, 48)
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in frames])
    fours = [frames[i : i + 4] for i in range(0, len(frames), 4)]
    RenderChunk.objects.bulk_create([RenderChunk(job=job, index=i, frames=four) for i, four in enumerate(fours)])
    began = time.monotonic()
    assert slices.dispatch(job.pk) == max_slices
    ended: Callable[[], bool] = lambda: RenderJob.objects.get(pk=job.pk).ended  # noqa: E731
    wait_for(ended, 600, "the job to end")
    took = time.monotonic() - began
    job.refresh_from_db()
    assert job.state == RenderJob.State.DONE, job.failure_message
    hosts = set(RenderChunk.objects.filter(job=job).values_list("slice__gpu__host__name", flat=True))
    assert len(hosts) == max_slices, f"rendered on {hosts}"
    held = Slice.objects.filter(holder_kind=HolderKind.RENDER, holder_id=job.pk, released_at__isnull=True)
    wait_for(lambda: not held.exists(), 60, "its slices released (each worker's last run over)")  # for the next
    return took


def test_a_48_frame_job_on_one_host_against_two(
    lab: Lab, render_hosts: dict[str, object], render_stack: Path, scenes: Path, alice: User, prices: None,
    settings,  # type: ignore[no-untyped-def]
) -> None:  # fmt: skip
    use_fleet(settings, fleet_spec(lab.name))
    figures: dict[str, list[float]] = {"one_host_s": [], "two_hosts_s": []}
    for _ in range(max(1, RUNS - 1)):
        figures["one_host_s"].append(render_48(alice, scenes / "small.blend", 1))
        figures["two_hosts_s"].append(render_48(alice, scenes / "small.blend", 2))
    out("render", figures)
