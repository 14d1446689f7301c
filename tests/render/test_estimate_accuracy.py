# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""The estimate people confirm money on, against the render it estimates, on the real stack: the probe's
estimate of a scene of a few frames, then the same job confirmed and rendered by the render worker in the
sandbox, its slice's holding (what the meter bills) set against the estimate's time and cost.

The scene is Blender 3.4's default cube turning, Cycles with adaptive sampling on as Blender's default has it:
at 65,536 samples most pixels converge in the first few hundred, which a probe at a few samples cannot see.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from billing.models import Usage
from sessions.render import progress, services
from sessions.render.models import RenderJob
from tests.render.stack import (  # noqa: F401 (fixtures)
    blender_in_image,
    make_job,
    own_folder,
    render_image,
    render_root,
    render_stack,
    render_worker,
    slices_of,
    state_of,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State
WITHIN = 0.25  # the bound: the estimate within 25 % of the real render
ATTEMPTS = 3

FEW_FRAMES_SCENE = """
import bpy
scene = bpy.context.scene
scene.render.engine = "CYCLES"
scene.cycles.use_denoising = False
scene.render.resolution_x, scene.render.resolution_y, scene.render.resolution_percentage = 320, 240, 100
scene.frame_start, scene.frame_end = 1, 3
cube = bpy.data.objects["Cube"]
cube.keyframe_insert("rotation_euler", frame=1)
cube.rotation_euler[2] = 1.5
cube.keyframe_insert("rotation_euler", frame=3)
bpy.ops.wm.save_as_mainfile(filepath="/out/few-frames.blend")
"""


@pytest.fixture(scope="module")
def few_frames(render_image: str) -> Iterator[Path]:
    with own_folder("estimate-scene") as folder:
        blender_in_image(folder, FEW_FRAMES_SCENE)
        yield folder / "few-frames.blend"


def render_slice_charge(job: RenderJob, probe_slice_id: int) -> tuple[float, Decimal]:
    """The job's render slice's holding in seconds, and what the meter charged for it."""
    [held] = [taken for taken in slices_of(job) if taken.pk != probe_slice_id]
    assert held.held_from is not None and held.held_until is not None
    wait_for(lambda: Usage.objects.filter(slice=held, open=False).exists(), 60, "the meter's charge")
    usage = Usage.objects.get(slice=held)
    return (held.held_until - held.held_from).total_seconds(), usage.per_minute * usage.billed_minutes


def estimated_then_rendered(owner: User, scene: Path, samples: int) -> tuple[services.Estimate, float, Decimal]:
    """A job of three frames in two chunks: its estimate, then its render slice's holding and charge."""
    job = make_job(owner, scene, [1, 2, 3], State.VALIDATED, samples=samples, chunk_size=2)
    services.request_estimate(job.pk)
    wait_for(lambda: state_of(job) != State.ESTIMATING, 180, "the probe's estimate")
    assert state_of(job) == State.AWAITING_CONFIRMATION, RenderJob.objects.get(pk=job.pk).failure_message
    estimate = services.estimate_of(job)
    assert estimate is not None and (estimate.chunks, estimate.slices, estimate.probe_frames) == (2, 1, (1, 2, 3))
    [probe_slice] = slices_of(job)

    services.confirm(job.pk, owner)
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 240, "the job to end")
    assert state_of(job) == State.DONE
    wait_for(lambda: all(taken.released_at for taken in slices_of(job)), 30, "its slices released")
    return (estimate, *render_slice_charge(job, probe_slice.pk))


@pytest.mark.parametrize("samples", [16, 65536], ids=["16-samples", "65536-samples"])
def test_the_estimate_of_a_few_frames_is_within_a_quarter_of_their_real_render_and_costs_what_it_is_charged(
    render_stack: Path, few_frames: Path, alice: User, samples: int
) -> None:
    # The probe and the render run seconds apart on a machine others share: a pair that a change of load
    # between them put out of bounds is tried again (a stale estimator is out by 30 to 700 times, every time).
    tried: list[str] = []
    for _ in range(ATTEMPTS):
        estimate, held_s, charged = estimated_then_rendered(alice, few_frames, samples)
        assert estimate.cost == progress.shown(charged), "the estimate's cost is what the meter charged"
        ratio = estimate.total_seconds / held_s
        tried.append(f"estimated {estimate.total_seconds} s, held {held_s:.2f} s ({ratio:.2f})")
        assert 0.5 <= ratio <= 2, tried
        if 1 - WITHIN <= ratio <= 1 + WITHIN:
            return
    raise AssertionError(f"not within {WITHIN:.0%} in {ATTEMPTS} tries: {tried}")
