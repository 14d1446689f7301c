"""The file-store seam (issue 31, item 4): a render worker is given the job's scene by the store, checked
against the checksum unpacking recorded, and gives each frame back with its checksum. A scene changed after it
was checked renders nothing: the job fails at once and says why. The steps are the store's and the database's
alone, so these run without Docker; the real stack's frames carry their checksums in test_pages_lifecycle."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from sessions.gpus.allocator import allocate
from sessions.gpus.holders import Holder
from sessions.render import chunks, filestore, stores
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.gpus.conftest import use_fleet

pytestmark = pytest.mark.django_db
WHOLE = {"gpu_kind": "whole", "gpu_profile": "", "gpu_model": "A100-SXM4-80GB"}


def job_with_a_scene(owner: User, state: str = RenderJob.State.RENDERING) -> RenderJob:
    """A job whose scene (a .blend and a texture) was unpacked and its checksum recorded."""
    job = RenderJob.objects.create(
        owner=owner,
        state=state,
        upload_name="shot.zip",
        folder=f"t{owner.pk}/{secrets.token_hex(8)}",
        main_file="shot/main.blend",
        blend_files=["shot/main.blend"],
        frame_spec="1",
        frames=[1],
        frame_count=1,
        chunk_size=1,
        **WHOLE,  # type: ignore[arg-type]
    )
    (job.scene_path() / "shot" / "tex").mkdir(parents=True)
    (job.scene_path() / "shot" / "main.blend").write_bytes(b"BLENDER-v304" + os.urandom(4096))
    (job.scene_path() / "shot" / "tex" / "wood.png").write_bytes(os.urandom(2048))
    job.scene_sha256 = stores.current().record_scene(job)
    job.save(update_fields=["scene_sha256"])
    return job


def a_byte_changed(job: RenderJob) -> None:
    """One byte of the texture, its size and modification time kept."""
    texture = job.scene_path() / "shot" / "tex" / "wood.png"
    before = texture.stat()
    data = bytearray(texture.read_bytes())
    data[100] ^= 0xFF
    texture.write_bytes(bytes(data))
    os.utime(texture, ns=(before.st_atime_ns, before.st_mtime_ns))


def a_file_added(job: RenderJob) -> None:
    (job.scene_path() / "shot" / "extra.py").write_text("import os")


def a_file_gone(job: RenderJob) -> None:
    (job.scene_path() / "shot" / "tex" / "wood.png").unlink()


def a_link_in_place(job: RenderJob) -> None:
    texture = job.scene_path() / "shot" / "tex" / "wood.png"
    texture.unlink()
    texture.symlink_to("/etc/hostname")


def test_the_scene_is_given_as_unpacking_recorded_it(alice: User, render_dir: Path) -> None:
    job = job_with_a_scene(alice)
    scene = stores.current().fetch_scene(job)
    assert (scene.folder, scene.blend, scene.name) == (job.scene_path(), "shot/main.blend", "shot/main.blend")
    assert stores.current().fetch_scene(job).folder == job.scene_path(), "and again, from the files' signature"


@pytest.mark.parametrize("change", [a_byte_changed, a_file_added, a_file_gone, a_link_in_place])
def test_a_scene_changed_after_it_was_checked_is_refused(
    alice: User, render_dir: Path, change: Callable[[RenderJob], None]
) -> None:
    job = job_with_a_scene(alice)
    stores.current().fetch_scene(job)  # read whole once: the next fetch compares the files' signature
    change(job)
    with pytest.raises(filestore.SceneChanged):
        stores.current().fetch_scene(job)


def test_a_scene_whose_checksum_was_never_recorded_is_refused(alice: User, render_dir: Path) -> None:
    job = job_with_a_scene(alice)
    RenderJob.objects.filter(pk=job.pk).update(scene_sha256="")
    job.refresh_from_db()
    with pytest.raises(filestore.SceneChanged, match="never checked"):
        stores.current().fetch_scene(job)


def test_a_chunk_whose_scene_changed_fails_its_job_at_once_and_renders_nothing(
    alice: User, render_dir: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    """It would be so on every slice: no retry, the job failed with why, its slice released."""
    use_fleet(settings, "r: 1xA100-80GB:whole")
    settings.RENDER_CHUNK_ATTEMPTS = 3
    job = job_with_a_scene(alice)
    RenderFrame.objects.create(job=job, number=1)
    RenderChunk.objects.create(job=job, index=0, frames=[1])
    held = allocate(alice, job.request, holder=Holder.render(job.pk))
    a_byte_changed(job)

    chunks.work_on_slice(job.pk, held.pk)

    job.refresh_from_db()
    assert job.state == RenderJob.State.FAILED
    assert "scene's files changed after they were checked" in job.failure_message, job.failure_message
    assert RenderChunk.objects.get(job=job).attempts == 1, "not tried again"
    held.refresh_from_db()
    assert held.released_at is not None and held.held_from is None, "no container ever held it"


def test_a_frame_given_back_carries_the_checksum_of_what_the_sandbox_wrote(alice: User, render_dir: Path) -> None:
    job = job_with_a_scene(alice)
    folder = stores.current().output_for(job, "chunk0-1")
    folder.mkdir(parents=True)
    data = os.urandom(5000)
    (folder / "frame_000001.png").write_bytes(data)
    opened = io.BytesIO(data)
    opened.read(100)  # a thumbnail read part of it first
    stored = stores.current().put_frame(job, folder, "frame_000001.png", opened)
    assert stored == filestore.StoredFrame("frames/chunk0-1/frame_000001.png", hashlib.sha256(data).hexdigest())
    assert opened.tell() == 0, "left at its start for whoever reads it next"
