# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""The render sandbox runs as the render image's own unprivileged user (uid 10000) whoever runs the portal,
never as the portal's user: shown on the real stack (Docker, the render image, Blender, PostgreSQL) with the
slice's worker running here under an ordinary uid of its own (``as_user``: this process's effective ids,
with the Docker group, as a portal started by a person in that group would run). The frames are the
sandbox user's, the portal still reads them for their thumbnails, and it still removes all of the job's
files, a folder the sandbox made beside its frames included."""

from __future__ import annotations

import contextlib
import grp
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from PIL import Image
from pytest_django.fixtures import Settings

from sessions.render import chunks, jobs
from sessions.render.models import RenderFrame, RenderJob
from sessions.runtime.blender import RENDER_UID
from tests.render.sandbox_acts import alongside, exec_in, running_container
from tests.render.stack import (  # noqa: F401 (fixtures)
    own_folder,
    queued_as_one_chunk,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    state_of,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
PORTAL_UID = PORTAL_GID = 4242  # an ordinary user's ids, not the image's


@contextlib.contextmanager
def as_user(uid: int, gid: int) -> Iterator[None]:
    """This process acts as ``uid``:``gid`` (its effective ids) with the Docker group beside, then as root again."""
    groups = os.getgroups()
    os.setgroups([grp.getgrnam("docker").gr_gid])
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


@pytest.fixture
def portals_folder(settings: Settings) -> Iterator[Path]:
    """A render folder of the unprivileged portal's own."""
    with own_folder("render-as-user") as folder:
        os.chown(folder, PORTAL_UID, PORTAL_GID)
        settings.RENDER_DIR = folder
        yield folder


def owned_by_portal(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, PORTAL_UID, PORTAL_GID, follow_symlinks=False)


def test_a_portal_that_is_not_root_renders_as_the_images_user_and_still_reads_and_removes_everything(
    render_stack: Path, portals_folder: Path, scenes: Path, alice: User
) -> None:
    job, held = queued_as_one_chunk(alice, scenes / "small.blend", [1, 2], (64, 48))
    owned_by_portal(portals_folder)
    # This machine's Python lies in root's home, which no other user may read: what the worker imports late
    # (Pillow's format plugins) is imported now. A portal's own user reads its own Python.
    Image.init()

    def sandbox() -> None:  # a folder with a file in it, beside the frames
        exec_in(running_container(job), ["sh", "-c", "mkdir /out/cache && echo x > /out/cache/data"])

    with as_user(PORTAL_UID, PORTAL_GID), alongside(sandbox):
        chunks.work_on_slice(job.pk, held.pk)

    assert state_of(job) == RenderJob.State.DONE, RenderJob.objects.get(pk=job.pk).failure_message
    for frame in RenderFrame.objects.filter(job=job):
        assert (job.folder_path() / frame.output_path).stat().st_uid == RENDER_UID, "written as the image's user"
        assert frame.thumbnail_path, "the portal read the frame"
    with as_user(PORTAL_UID, PORTAL_GID):
        removed = jobs.remove_files(job)
    assert removed and not job.folder_path().exists(), sorted(map(str, job.folder_path().rglob("*")))
    shutil.rmtree(portals_folder / job.folder.split("/")[0], ignore_errors=True)
