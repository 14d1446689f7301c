# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A render job on the real stack, from the probe to its last frame: PostgreSQL, Redis, a Celery worker on
the render queue, the Docker engine with the stand-in NVIDIA hook, the render image, a MIG slice of the
simulated fleet (Cycles renders on the CPU). Progress arrives over the websocket as it renders; the slice is
released with its holding recorded, and the billing meter (billing's task on the default queue's worker, as
the holding's end sends it) charges those minutes: the ledger takes them from the owner's wallet."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.core.cache import cache
from django.urls import reverse
from PIL import Image

from billing import ledger
from billing.models import Usage
from sessions.gpus.models import Slice
from sessions.render import progress, services
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.helpers.websockets import open_socket
from tests.render.stack import (  # noqa: F401 (fixtures)
    charged_by_the_meter,
    containers_of,
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


async def follow_until_done(job: RenderJob, user: User, timeout: float = 240) -> list[dict[str, Any]]:
    """Confirm the job with the job's socket open, and collect what the socket says until it is done."""
    events: list[dict[str, Any]] = []  # a push of the estimate's end may still be on its way
    socket, opened, code = await open_socket(f"/ws/render/{job.pk}/", user, early=events)
    assert opened, f"the job's socket closed with {code}"
    await database_sync_to_async(services.confirm)(job.pk, user)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        event = await socket.receive_json_from(timeout=deadline - loop.time())
        events.append(event)
        if event.get("state") in RenderJob.ENDED:
            break
    await socket.disconnect()
    return events


def estimated(job: RenderJob) -> Slice:
    """The probe's estimate, and the slice it ran on (released, its minutes recorded)."""
    services.request_estimate(job.pk)
    wait_for(lambda: state_of(job) != State.ESTIMATING, 180, "the probe's estimate")
    job.refresh_from_db()
    assert job.state == State.AWAITING_CONFIRMATION, job.failure_message
    estimate = services.estimate_of(job)
    assert estimate is not None
    assert (estimate.facts["resolution_x"], estimate.facts["camera"], estimate.device) == (64, True, "CPU")
    assert estimate.seconds_per_frame > 0 and estimate.chunks == 2 and estimate.cost.endswith("CNY")
    [probe_slice] = slices_of(job)
    assert probe_slice.released_at is not None and probe_slice.held_from and probe_slice.held_until
    return probe_slice


def rendered_and_billed(job: RenderJob, probe_slice: Slice) -> None:
    job.refresh_from_db()
    assert job.state == State.DONE, job.failure_message
    frames = list(RenderFrame.objects.filter(job=job).order_by("number"))
    assert [frame.state for frame in frames] == [RenderFrame.State.DONE] * 3
    for frame in frames:
        with Image.open(job.folder_path() / frame.output_path) as image:
            assert (image.format, image.size) == ("PNG", (64, 48))
        with Image.open(job.folder_path() / frame.thumbnail_path) as thumbnail:
            assert thumbnail.format == "JPEG" and max(thumbnail.size) <= 320
    assert [chunk.frames for chunk in RenderChunk.objects.filter(job=job)] == [[1, 2], [3]]
    wait_for(lambda: slices_of(job)[-1].released_at, 30, "the render slice released")
    assert containers_of(job) == []
    render_slice = slices_of(job)[-1]
    assert render_slice.pk != probe_slice.pk and render_slice.profile == "1g.18gb"
    assert render_slice.held_from is not None and render_slice.held_until is not None
    assert render_slice.released_at is not None
    assert render_slice.held_from <= render_slice.held_until <= render_slice.released_at
    for held in (probe_slice, render_slice):
        charged_by_the_meter(held)


async def test_three_frames_render_on_a_mig_slice_with_live_progress_and_are_billed(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job = await database_sync_to_async(make_job)(alice, scenes / "small.blend", [1, 2, 3], State.VALIDATED)
    balance_before = await database_sync_to_async(ledger.balance)(alice)
    probe_slice = await database_sync_to_async(estimated)(job)

    events = await follow_until_done(job, alice)

    assert [event["frames_done"] for event in events if event["state"] == State.DONE][-1] == 3
    assert sorted({event["frames_done"] for event in events}) == [0, 1, 2, 3]
    sampling = [event for event in events if event.get("samples") is not None]
    assert sampling and all(event["samples"] == 4 for event in sampling), events
    assert any(event.get("log_tail") for event in events)
    assert {event.get("device") for event in events if event.get("device")} == {"CPU"}, "Cycles on the CPU"
    finished = events[-1]
    assert finished["frames_total"] == 3 and finished["percent"] == 100 and finished["cost"].endswith("CNY")
    assert finished["seconds_per_frame"] > 0 and finished["latest_frame"] in (1, 2, 3)
    rendering = [event for event in events if event["state"] == State.RENDERING]
    assert any(event["eta_seconds"] is not None for event in rendering), "a time left once a frame is done"
    assert any(event["thumbnail"] for event in rendering), "the latest finished frame's thumbnail, as it renders"
    assert finished["thumbnail"] == reverse("render-frame-thumbnail", args=[job.pk, finished["latest_frame"]])
    await database_sync_to_async(rendered_and_billed)(job, probe_slice)
    # What the wallet lost is what the job's two holdings were charged, and the job page's cost says so.
    paid = await database_sync_to_async(paid_for)(job)
    assert await database_sync_to_async(ledger.balance)(alice) == balance_before - paid
    assert await database_sync_to_async(progress.cost_so_far)(job) == paid


def paid_for(job: RenderJob) -> Decimal:
    usages = Usage.objects.filter(slice__in=slices_of(job))
    return sum((usage.per_minute * usage.billed_minutes for usage in usages), Decimal(0))


def test_a_job_on_two_slices_renders_its_chunks_on_whichever_is_free_and_releases_both(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    job = make_job(alice, scenes / "small.blend", [1, 2, 3, 4], State.AWAITING_CONFIRMATION, chunk_size=1, max_slices=2)

    services.confirm(job.pk, alice)
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 240, "the job to end")

    assert state_of(job) == State.DONE
    held = slices_of(job)
    assert len(held) == 2 and {taken.profile for taken in held} == {"1g.18gb"}
    used = set(RenderChunk.objects.filter(job=job).values_list("slice_id", flat=True))
    assert used == {taken.pk for taken in held}, "each slice rendered some of the chunks"
    wait_for(lambda: all(taken.released_at for taken in slices_of(job)), 30, "both slices released")
    assert all(taken.held_from and taken.held_until for taken in slices_of(job))
    assert RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE).count() == 4


def test_an_openexr_job_renders_exr_frames_with_thumbnails_from_blenders_own_pngs(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    cache.delete(services.FORMATS_KEY)
    job = make_job(alice, scenes / "small.blend", [1, 2], State.VALIDATED, output_format="OPEN_EXR")
    services.request_estimate(job.pk)
    wait_for(lambda: state_of(job) != State.ESTIMATING, 180, "the probe's estimate")
    assert state_of(job) == State.AWAITING_CONFIRMATION, RenderJob.objects.get(pk=job.pk).failure_message
    assert services.writable_formats() == ("PNG", "OPEN_EXR"), "the probe said what the build writes"

    services.confirm(job.pk, alice)
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 180, "the job to end")

    assert state_of(job) == State.DONE
    for frame in RenderFrame.objects.filter(job=job).order_by("number"):
        assert (job.folder_path() / frame.output_path).read_bytes()[:4] == b"\x76\x2f\x31\x01", "an OpenEXR file"
        assert Path(frame.thumbnail_path).name == f"frame_{frame.number:06d}.jpg"
        with Image.open(job.folder_path() / frame.thumbnail_path) as thumbnail:
            assert (thumbnail.format, thumbnail.size) == ("JPEG", (64, 48))
    assert not list(job.folder_path().rglob("preview_*")), "Blender's PNGs served their thumbnails and went"
    wait_for(lambda: all(taken.released_at for taken in slices_of(job)), 30, "its slices released")
