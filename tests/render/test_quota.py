"""A person's storage quota on the render path: each job's folder measured by part (scene, frames) without
following links, every file at least 4 KiB and a sparse one at its full length; an upload that would pass the
quota refused at its start, before a part is sent, saying what uses the quota and what to remove (uploads on
their way count at their declared length); a zip that would unpack past it refused on the form, its upload
kept; the page shows used of quota with each thing and a removal for it; removing an ended job's files frees
its share at once."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from sessions.render import storage as render_storage
from sessions.render.models import RenderJob, RenderUpload
from sessions.runtime.watchdogs import size_words
from sessions.storage import usage
from sessions.storage.models import StorageUse
from tests.render import scenes
from tests.render.conftest import TUS, Upload, begin_upload, form_fields, sha256_of, upload_file
from tests.render.leftovers import assert_left_as_found, traces

pytestmark = pytest.mark.django_db
State = RenderJob.State
Kind = StorageUse.Kind
KIB, MIB, GIB = 1024, 1024**2, 1024**3


def a_job_with_files(owner: User, state: State = State.DONE, frame_bytes: int = 8 * KIB, **fields: object) -> RenderJob:
    """A job with what a render leaves: its scene (12 KiB), an estimate, a frame of ``frame_bytes`` and a
    thumbnail; each file a whole number of 4 KiB blocks, so what the disk holds is what was written."""
    job = RenderJob.objects.create(
        owner=owner, state=state, upload_name="shot.blend", folder=f"u{owner.pk}/{secrets.token_hex(16)}",
        main_file="scene.blend", frame_spec="1", frames=[1], frame_count=1, gpu_kind="mig", gpu_profile="1g.18gb",
        gpu_model="H200-SXM5-141GB", finished_at=timezone.now() if state in RenderJob.ENDED else None, **fields,
    )  # fmt: skip
    folder = job.folder_path()
    (folder / "scene").mkdir(parents=True)
    (folder / "scene" / "scene.blend").write_bytes(os.urandom(12 * KIB))
    (folder / "estimate.json").write_text("{}")
    (folder / "frames" / "chunk0-1").mkdir(parents=True)
    (folder / "frames" / "chunk0-1" / "frame_0001.png").write_bytes(os.urandom(frame_bytes))
    (folder / "thumbnails").mkdir()
    (folder / "thumbnails" / "frame_0001.jpg").write_bytes(b"\xff\xd8\xff")
    return job


def use_of(job: RenderJob) -> StorageUse:
    return StorageUse.objects.get(kind=Kind.RENDER_JOB, key=str(job.pk))


def test_a_jobs_folder_is_measured_by_part_without_following_links_with_sparse_files_at_full_length(
    alice: User, render_dir: Path, tmp_path: Path
) -> None:
    job = a_job_with_files(alice)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(5 * MIB))
    run = job.folder_path() / "frames" / "chunk0-1"
    (run / "frame_0002.png").symlink_to(outside)  # what a sandboxed run could leave: counted as a link
    with (run / "frame_0003.exr").open("wb") as sparse:
        sparse.truncate(GIB)  # takes no block, but could be filled: counted at its full length
    (run / "empty").touch()

    render_storage.measure_job(job)

    found = use_of(job)
    # scene: the folder scene/, scene.blend (12 KiB), estimate.json (4 KiB at least)
    scene = 4 * KIB + 12 * KIB + 4 * KIB
    # frames: frames/, chunk0-1/, the frame (8 KiB), the link, the sparse file, the empty file, thumbnails/, its JPEG
    frames = 4 * KIB + 4 * KIB + 8 * KIB + 4 * KIB + GIB + 4 * KIB + 4 * KIB + 4 * KIB
    assert found.parts == {"scene": scene, "frames": frames}
    assert (found.bytes, found.owner_id, found.label) == (scene + frames, alice.pk, "shot.blend")
    assert found.url == reverse("render-job-detail", args=[job.pk])


def test_removing_a_jobs_files_forgets_its_share(alice: User, render_dir: Path) -> None:
    from sessions.render import jobs

    job = a_job_with_files(alice)
    render_storage.measure_job(job)
    assert usage.used_by(alice.pk) > 0
    assert jobs.remove_files(job)
    assert usage.used_by(alice.pk) == 0 and not job.folder_path().exists()


def test_an_upload_that_would_pass_the_quota_is_refused_at_its_start_saying_what_uses_it_and_what_to_remove(
    alice: User, alice_client: Client, bob_client: Client, render_dir: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = MIB
    job = a_job_with_files(alice, frame_bytes=600 * KIB)
    render_storage.measure_job(job)
    used = usage.used_by(alice.pk)
    before = traces(render_dir)

    refused = begin_upload(alice_client, "next.blend", MIB - used + 1)

    assert refused.status_code == 413
    words = refused.content.decode()
    assert words.startswith(
        f"This upload of {size_words(MIB - used + 1)} would pass your storage quota. "
        f"You use {size_words(used)} of your 1 MiB storage quota: render job 'shot.blend' "
    ), words
    assert "(scene 20 KiB, frames 616 KiB)" in words
    assert "remove what you no longer need: cancel render jobs or remove their files on the Render jobs page" in words
    assert_left_as_found(before, render_dir)  # nothing of the refused upload on disk or in the database
    assert begin_upload(alice_client, "next.blend", MIB - used).status_code == 201, "what is left still fits"
    assert begin_upload(bob_client, "other.blend", MIB).status_code == 201, "bob's quota is his own"


def test_uploads_on_their_way_count_at_their_declared_length(
    alice: User, alice_client: Client, render_dir: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = MIB
    first = begin_upload(alice_client, "a.blend", 600 * KIB)  # not a byte of it sent yet
    assert first.status_code == 201
    assert begin_upload(alice_client, "b.blend", 600 * KIB).status_code == 413
    assert usage.used_by(alice.pk) == 600 * KIB

    gone = alice_client.delete(str(first["Location"]), headers=TUS)  # its owner cancels it
    assert gone.status_code == 204
    assert usage.used_by(alice.pk) == 0
    assert begin_upload(alice_client, "b.blend", 600 * KIB).status_code == 201


def test_a_zip_that_would_unpack_past_the_quota_is_refused_on_the_form_and_its_upload_kept(
    alice: User, alice_client: Client, render_dir: Path, fleet: None, settings
) -> None:  # type: ignore[no-untyped-def]
    # Incompressible: the zip takes as much as its scene, and both are on the disk while it unpacks.
    blend = scenes.blend(blocks=[*scenes.BLOCKS[:-1], (b"TEST", os.urandom(400 * KIB)), scenes.BLOCKS[-1]])
    data = scenes.zip_of(("shot.blend", blend))
    settings.STORAGE_QUOTA_BYTES = len(data) + len(blend) - 1
    token = upload_file(alice_client, "shot.zip", data)

    answer = alice_client.post(
        reverse("render-job-upload"), {**form_fields(), "upload": token, "sha256": sha256_of(data)}
    )

    assert answer.status_code == 400
    page = strip_tags(answer.content.decode())
    assert "shot.zip unpacks to" in page and "would pass your storage quota" in page, page
    assert not RenderJob.objects.exists()
    assert RenderUpload.objects.filter(token=token).exists(), "kept: sent again once there is room"
    settings.STORAGE_QUOTA_BYTES = len(data) + len(blend)
    fields = {**form_fields(), "upload": token, "sha256": sha256_of(data)}
    assert alice_client.post(reverse("render-job-upload"), fields).status_code == 302
    job = RenderJob.objects.get()
    assert usage.used_by(alice.pk) == len(data) + len(blend), "reserved until it is unpacked and measured"
    assert job.state == State.UNPACKING


def test_an_unpacked_job_is_measured_as_it_lies_on_disk(
    alice: User, post_scene: Upload, render_dir: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    from tests.render.conftest import unpacked

    data = scenes.zip_of(("shot.blend", scenes.blend()), ("tex/a.png", os.urandom(10 * KIB)))
    assert post_scene("shot.zip", data).status_code == 302
    job = unpacked(RenderJob.objects.get())
    assert job.state in (State.VALIDATED, State.ESTIMATING)
    found = use_of(job)
    # scene/, shot.blend (one block), tex/, a.png (12 KiB): the zip itself is gone
    assert found.parts == {"scene": 4 * KIB + 4 * KIB + 4 * KIB + 12 * KIB, "frames": 0}


def test_the_page_shows_used_of_quota_with_what_uses_it_and_a_removal_for_each(
    alice: User, alice_client: Client, render_dir: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.STORAGE_QUOTA_BYTES = 10 * MIB
    done = a_job_with_files(alice, State.DONE, frame_bytes=MIB)
    waiting = a_job_with_files(alice, State.AWAITING_CONFIRMATION)
    for job in (done, waiting):
        render_storage.measure_job(job)
    upload = begin_upload(alice_client, "next.blend", 2 * MIB)
    token = str(upload["Location"]).rstrip("/").rsplit("/", 1)[1]
    usage.record(alice.pk, Kind.WORK_VOLUME, "vol", label="work/", size=3 * MIB, url=reverse("session-list"))

    page = alice_client.get(reverse("render-job-list")).content.decode()

    section = page.split('id="storage"', 1)[1].split("</section>", 1)[0]
    text = " ".join(strip_tags(section).split())
    used = usage.used_by(alice.pk)
    assert f"{size_words(used)} of 10 MiB" in text, text
    assert f'<progress max="100" value="{round(100 * used / (10 * MIB))}"' in section
    assert "Notebook work folder work/ 3 MiB" in text
    assert "Upload on its way next.blend 2 MiB" in text
    assert "scene 20 KiB, frames 1.02 MiB" in text
    assert reverse("render-job-remove-files", args=[done.pk]) in section, "an ended job's files can go"
    assert reverse("render-job-cancel", args=[waiting.pk]) in section, "one not queued yet is cancelled"
    assert reverse("render-upload-discard", args=[token]) in section


def test_an_ended_jobs_files_are_removed_at_its_owners_asking_and_its_share_freed(
    alice: User, alice_client: Client, bob_client: Client, render_dir: Path
) -> None:
    job = a_job_with_files(alice, State.DONE)
    running = a_job_with_files(alice, State.RENDERING)
    for each in (job, running):
        render_storage.measure_job(each)
    address = reverse("render-job-remove-files", args=[job.pk])

    assert bob_client.post(address).status_code == 404, "nobody reaches another person's job"
    refused = alice_client.post(reverse("render-job-remove-files", args=[running.pk]))
    assert refused.status_code == 409 and running.folder_path().exists(), "a job that runs is cancelled first"
    answer = alice_client.post(address)

    assert answer.status_code == 302
    job.refresh_from_db()
    assert job.files_removed_at is not None and not job.folder_path().exists()
    assert [use.key for use in StorageUse.objects.all()] == [str(running.pk)]
    page = alice_client.get(reverse("render-job-detail", args=[job.pk])).content.decode()
    assert 'data-testid="files-removed"' in page


def test_an_upload_is_discarded_from_the_page_and_its_reservation_freed(
    alice: User, alice_client: Client, bob_client: Client, render_dir: Path
) -> None:
    created = begin_upload(alice_client, "next.blend", 2 * MIB)
    token = str(created["Location"]).rstrip("/").rsplit("/", 1)[1]
    address = reverse("render-upload-discard", args=[token])
    assert bob_client.post(address).status_code == 404 and RenderUpload.objects.exists()

    assert alice_client.post(address).status_code == 302
    assert not RenderUpload.objects.exists() and usage.used_by(alice.pk) == 0
    assert [path for path in render_dir.rglob("*") if path.is_file()] == []
