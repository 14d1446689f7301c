# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A scene made by Blender whose embedded Python (a registered text block, a scripted driver) would write
files, open a connection and change what is rendered, taken the product's own way on the real stack: the
render worker's probe reads and estimates it, the job's chunk renders it, and none of its Python runs in
either; the job ends holding no slice and no container. (tests/sessions_runtime/test_render_sandbox.py
shows the same file does all of that when Blender is allowed to run scripts.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from PIL import Image

from sessions.render import services
from sessions.render.models import RenderFrame, RenderJob
from tests.render.leftovers import traces
from tests.render.stack import (  # noqa: F401 (fixtures)
    HOSTILE_WIDTH,
    MARKERS,
    make_job,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    slices_of,
    state_of,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State


def test_a_scenes_text_block_and_driver_never_run_in_the_jobs_probe_or_its_render(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    before = traces(render_stack, docker=True)
    job = make_job(alice, scenes / "hostile.blend", [1, 2], State.VALIDATED, chunk_size=2, samples=1)

    services.request_estimate(job.pk)
    wait_for(lambda: state_of(job) != State.ESTIMATING, 180, "the probe's estimate")
    job.refresh_from_db()
    assert job.state == State.AWAITING_CONFIRMATION, job.failure_message
    estimate = services.estimate_of(job)
    assert estimate is not None
    # The probe's own output folder is gone by now; the facts it read tell whether the text block ran.
    assert (estimate.facts["resolution_x"], estimate.facts["resolution_y"]) == (32, 24), f"not {HOSTILE_WIDTH}"

    services.confirm(job.pk, alice)
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 180, "the job to end")
    job.refresh_from_db()
    assert job.state == State.DONE, job.failure_message
    for frame in RenderFrame.objects.filter(job=job):
        with Image.open(job.folder_path() / frame.output_path) as image:
            assert image.size == (32, 24), f"frame {frame.number} as the text block would have it"
    written = [path.relative_to(render_stack) for path in render_stack.rglob("*") if path.name in MARKERS]
    assert written == [], "a script of the scene wrote into an output folder"

    wait_for(lambda: all(taken.released_at for taken in slices_of(job)), 30, "its slices released")
    after = traces(render_stack, docker=True)
    assert (after.held_slices, after.containers) == (before.held_slices, before.containers)
    assert len(slices_of(job)) == 2, "one for the probe, one for the frames"
    ours = (job.folder.split("/")[0], job.folder)  # the owner's folder and the job's
    new_files = set(after.files) - set(before.files)
    outside = [name for name in new_files if name not in ours and not name.startswith(f"{job.folder}/")]
    assert outside == [], "written outside the job's folder"
