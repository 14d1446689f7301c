# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""What a failed attempt of a chunk leaves on disk, on the real stack (Docker, the render image, Blender): the
slice's worker runs here, and its container is killed twice from outside (as a dying engine or host would),
after its sandbox wrote files of its own beside the frames. Once the chunk is tried again, the failed run's
folder holds only the frames it finished (their rows point into it), and a run that finished none leaves no
folder at all; before, all of it stayed for the job's whole retention."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from pytest_django.fixtures import Settings

from sessions.render import chunks, filestore
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.render.sandbox_acts import alongside, exec_in, kill, running_container, write_in
from tests.render.stack import (  # noqa: F401 (fixtures)
    queued_as_one_chunk,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    state_of,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State


def litter(container: str) -> None:
    """What a run may leave besides its frames: a file, and a folder with one in it."""
    write_in(container, "partial.tmp", b"\0" * 4096)
    exec_in(container, ["sh", "-c", "mkdir /out/cache && echo x > /out/cache/data"])


def test_a_failed_attempts_folder_keeps_only_the_frames_it_finished_once_the_chunk_is_tried_again(
    render_stack: Path, scenes: Path, alice: User, settings: Settings
) -> None:
    settings.RENDER_CHUNK_ATTEMPTS = 3
    job, held = queued_as_one_chunk(alice, scenes / "slow.blend", [1, 2, 3], (320, 240))
    RenderJob.objects.filter(pk=job.pk).update(samples=64)  # a few seconds a frame

    def sandbox() -> None:
        first = running_container(job)
        litter(first)
        kill(first)  # before any frame
        second = running_container(job, other_than=(first,))
        litter(second)
        done = RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE)
        wait_for(done.exists, 120, "a frame of the second attempt")
        kill(second)

    with alongside(sandbox):
        chunks.work_on_slice(job.pk, held.pk)

    assert state_of(job) == State.DONE, RenderJob.objects.get(pk=job.pk).failure_message
    assert RenderChunk.objects.get(job=job).attempts == 3
    frames = job.folder_path() / filestore.FRAMES
    assert not (frames / "chunk0-1").exists(), "the first attempt finished nothing: its folder went"
    for attempt in ("chunk0-2", "chunk0-3"):
        kept = {path.relative_to(job.folder_path()).as_posix() for path in (frames / attempt).iterdir()}
        finished = RenderFrame.objects.filter(job=job, output_path__startswith=f"{filestore.FRAMES}/{attempt}/")
        assert kept == set(finished.values_list("output_path", flat=True)), f"{attempt} holds {sorted(kept)}"
    assert RenderFrame.objects.filter(job=job, output_path__contains="chunk0-2/").exists()
