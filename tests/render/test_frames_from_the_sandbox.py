# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""What a chunk's sandbox writes is read on the host with no more trust than the sandbox has, on the real
stack (Docker, the render image, Blender, PostgreSQL): the slice's worker runs here while a process in the
chunk's own container, as its user, does what a compromised Blender could (``tests/render/sandbox_acts.py``).
A frame file swapped for a link reads nothing outside; a PNG larger than the job renders, or an image of
another format under a frame's name, is never decoded; and a scene whose frames would be larger than the
portal renders fails its estimate, saying so, before anything is rendered."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.http import Http404
from PIL import Image
from pytest_django.fixtures import Settings

from sessions.render import chunks, filestore, results, services
from sessions.render.models import RenderFrame, RenderJob
from sessions.runtime import blender
from tests.render.sandbox_acts import (
    alongside,
    flip_in,
    kill,
    large_png,
    other_format,
    png,
    running_container,
    say_in,
    write_in,
)
from tests.render.stack import (  # noqa: F401 (fixtures)
    make_job,
    own_folder,
    queued_as_one_chunk,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    state_of,
    wait_for,
    with_estimate,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State
FrameState = RenderFrame.State
RED = (255, 0, 0)


def thumbnails_of(job: RenderJob) -> list[Path]:
    folder = job.folder_path() / filestore.THUMBNAILS
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.fixture
def portal_files() -> Iterator[tuple[Path, Path]]:
    """Two files of the portal's, outside any render folder: a small red PNG (a secret a thumbnail would
    show) and a PNG of 5000 x 5000 (costly to decode). Their last access is set before their last change, so
    the first read of either moves it (``relatime``)."""
    with own_folder("portal-files") as folder:
        secret, huge = folder / "secret.png", folder / "huge.png"
        secret.write_bytes(png(100, 100, RED))
        huge.write_bytes(large_png(5000, 5000))
        for path in (secret, huge):
            changed = path.stat().st_mtime_ns
            os.utime(path, ns=(changed - 10**10, changed))
        yield secret, huge


def test_frame_files_flipped_to_links_while_the_chunk_renders_read_nothing_outside_its_folder(
    render_stack: Path, scenes: Path, alice: User, settings: Settings, portal_files: tuple[Path, Path]
) -> None:
    settings.RENDER_CHUNK_ATTEMPTS = 1
    frames = list(range(1, 17))
    job, held = queued_as_one_chunk(alice, scenes / "small.blend", frames, (64, 48))
    secret, huge = portal_files
    read_before = {path: path.stat().st_atime_ns for path in portal_files}
    names = [blender.frame_file(number) for number in frames]

    with alongside(lambda: flip_in(running_container(job), names, (str(secret), str(huge)))):
        chunks.work_on_slice(job.pk, held.pk)

    assert {path: path.stat().st_atime_ns for path in portal_files} == read_before, "a portal file was read"
    made = thumbnails_of(job)
    assert made, "the frames the portal opened as files of their own have their thumbnails"
    for thumbnail in made:
        with Image.open(thumbnail) as image:
            assert image.size == (64, 48), f"{thumbnail.name} is not of a frame the job rendered"
            assert image.convert("RGB").getpixel((32, 24)) != RED, f"{thumbnail.name} shows the portal's file"
    for frame in RenderFrame.objects.filter(job=job, state=FrameState.DONE):
        if (job.folder_path() / frame.output_path).is_symlink():  # swapped after the portal read the file
            with pytest.raises(Http404):
                results.open_inside(job, frame.output_path)  # its download reads nothing outside either


def test_a_png_larger_than_the_job_renders_and_an_image_of_another_format_named_png_are_not_decoded(
    render_stack: Path, scenes: Path, alice: User, settings: Settings
) -> None:
    """The sandbox writes frames 2 and 3 itself before Blender reaches them, and says they were saved: a PNG
    of 4000 x 4000 where the job renders 320 x 240, and a BMP under a PNG's name."""
    settings.RENDER_CHUNK_ATTEMPTS = 1
    job, held = queued_as_one_chunk(alice, scenes / "slow.blend", [1, 2, 3], (320, 240))

    def sandbox() -> None:
        container = running_container(job)
        write_in(container, blender.frame_file(2), large_png(4000, 4000))
        write_in(container, blender.frame_file(3), other_format("BMP", 320, 240))
        for number in (2, 3):
            say_in(container, f"Saved: '{blender.OUTPUT_DIR}/{blender.frame_file(number)}'")
        done = RenderFrame.objects.filter(job=job, number__in=[2, 3], state=FrameState.DONE)
        wait_for(lambda: done.count() == 2, 60, "the portal to record what the sandbox said it saved")
        kill(container)

    with alongside(sandbox):
        chunks.work_on_slice(job.pk, held.pk)

    for number in (2, 3):
        frame = RenderFrame.objects.get(job=job, number=number)
        assert frame.thumbnail_path == "", f"frame {number} was decoded"
    assert thumbnails_of(job) == []


def test_a_scene_whose_frames_would_be_wider_than_the_portal_renders_fails_its_estimate_saying_so(
    render_stack: Path, scenes: Path, alice: User, settings: Settings
) -> None:
    """20000 x 16 at 100 %: refused with the setting's name; at 50 % (10000 x 8) it is estimated."""
    settings.RENDER_MAX_RESOLUTION = 16384
    wide = make_job(alice, scenes / "wide.blend", [1], State.ESTIMATING)
    half = make_job(alice, scenes / "wide.blend", [1], State.ESTIMATING, resolution_percent=50)

    services.estimate(wide.pk)
    services.estimate(half.pk)

    wide.refresh_from_db()
    assert wide.state == State.FAILED
    assert "20000 × 16 pixels" in wide.failure_message, wide.failure_message
    assert "at most 16384 pixels on a side (PORTAL_RENDER_MAX_RESOLUTION)" in wide.failure_message
    assert state_of(half) == State.AWAITING_CONFIRMATION, RenderJob.objects.get(pk=half.pk).failure_message
