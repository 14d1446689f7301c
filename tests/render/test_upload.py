"""Uploading a scene through the form: what becomes a job, and every bad upload refused in words with
nothing left on disk, including one stopped while it streams."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import StopUpload
from django.test import Client
from django.urls import reverse

from sessions.render import services
from sessions.render.models import RenderJob
from sessions.render.uploads import SceneUploadHandler, Upload, owner_folder
from tests.render import scenes
from tests.render.conftest import Upload as PostScene
from tests.render.conftest import form_fields, stored
from tests.render.leftovers import assert_left_as_found, assert_nothing_left, traces

pytestmark = pytest.mark.django_db


def refusal(response, field: str = "scene") -> list[str]:  # type: ignore[no-untyped-def]
    assert response.status_code == 400, response.content.decode()[:2000]
    return list(response.context["form"].errors.get(field, []))


def test_a_blend_becomes_a_checked_job_in_its_owners_folder(
    post_scene: PostScene, alice: User, render_dir: Path
) -> None:
    response = post_scene("My Shot.blend", scenes.zstd_blend("402"), frames="1-30, 45, 50-60x2", samples="64")
    job = RenderJob.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("render-job-detail", args=[job.pk])
    assert (job.owner, job.state, job.upload_name, job.main_file) == (
        alice,
        "estimating",
        "My Shot.blend",
        "scene.blend",
    )
    assert (job.frame_count, job.frames[:2], job.frames[-1], job.samples) == (37, [1, 2], 60, 64)
    assert (job.gpu_kind, job.gpu_model, job.gpu_profile, job.market) == (
        "mig",
        "H200-SXM5-141GB",
        "1g.18gb",
        "on_demand",
    )
    assert (job.resolution_percent, job.chunk_size, job.max_slices, job.blender_version) == (50, 4, 1, "4.2")
    owner, name = job.folder.split("/")
    assert owner == owner_folder(alice) and len(name) == 32  # a keyed hash, then 128 random bits
    assert stored(render_dir) == [owner, job.folder, f"{job.folder}/scene", f"{job.folder}/scene/scene.blend"]
    page = Client()
    page.force_login(alice)
    text = page.get(response["Location"]).content.decode()
    assert ">Estimating</span>" in text
    assert 'data-testid="estimating"' in text and 'hx-trigger="every 2s"' in text  # it polls for the estimate


def test_a_jobs_folder_and_its_owners_are_for_the_portals_user_alone(post_scene: PostScene, render_dir: Path) -> None:
    """Nobody else on the host lists or reads them (the render sandbox reaches the scene through its mount)."""
    assert post_scene("a.zip", scenes.zip_of(("shots/a.blend", scenes.blend()))).status_code == 302
    job = RenderJob.objects.get()
    for folder in (job.folder_path().parent, job.folder_path()):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, f"{folder.relative_to(render_dir)}: {folder.stat()}"


def test_a_zip_is_unpacked_beside_its_assets_and_the_archive_removed(post_scene: PostScene, render_dir: Path) -> None:
    data = scenes.zip_of(("shot/main.blend", scenes.blend()), ("shot/tex/wood.png", scenes.PNG))
    post_scene("shot.zip", data, spot="on")
    job = RenderJob.objects.get()
    assert (job.state, job.main_file, job.market) == ("estimating", "shot/main.blend", "spot")
    assert (job.scene_path() / "shot/tex/wood.png").read_bytes() == scenes.PNG
    assert not (job.folder_path() / "upload.zip").exists()


def test_a_zip_with_several_blends_asks_which_is_the_scene(
    post_scene: PostScene, alice_client: Client, render_dir: Path
) -> None:
    data = scenes.zip_of(("a.blend", scenes.blend()), ("shots/main.blend", scenes.gzip_blend()), ("x.png", scenes.PNG))
    response = post_scene("two.zip", data)
    job = RenderJob.objects.get()
    assert (job.state, job.main_file, job.blend_files) == ("uploaded", "", ["a.blend", "shots/main.blend"])
    page = alice_client.get(response["Location"]).content.decode()
    assert "Say which one is the scene" in page and 'value="shots/main.blend"' in page
    url = reverse("render-job-main-file", args=[job.pk])
    wrong = alice_client.post(url, {"main_file": "x.png"})
    assert wrong.status_code == 400 and "Select a valid choice" in wrong.content.decode()
    assert alice_client.post(url, {"main_file": "shots/main.blend"}).status_code == 302
    job.refresh_from_db()
    assert (job.state, job.main_file, job.blender_version) == ("estimating", "shots/main.blend", "2.79")


def test_a_main_file_named_on_the_form_is_used_and_a_wrong_name_refused(
    post_scene: PostScene, render_dir: Path
) -> None:
    data = scenes.zip_of(("a.blend", scenes.blend()), ("b.blend", scenes.blend()))
    assert "The zip holds no 'c.blend'; its .blend files are 'a.blend', 'b.blend'." in refusal(
        post_scene("two.zip", data, main_file="c.blend")
    )
    assert_nothing_left(render_dir)
    post_scene("two.zip", data, main_file="b.blend")
    assert RenderJob.objects.get().main_file == "b.blend"


def test_a_chosen_main_file_that_is_no_blend_is_refused_and_the_job_waits(
    post_scene: PostScene, alice_client: Client, render_dir: Path
) -> None:
    post_scene("two.zip", scenes.zip_of(("a.blend", scenes.blend()), ("b.blend", scenes.PNG)))
    job = RenderJob.objects.get()
    before = traces(render_dir)
    answer = alice_client.post(reverse("render-job-main-file", args=[job.pk]), {"main_file": "b.blend"})
    assert answer.status_code == 400 and "is not a Blender file: it is a PNG image" in answer.content.decode()
    assert_left_as_found(before, render_dir)  # still uploaded, its files as they were, no probe sent


BAD_UPLOADS = [
    ("photo.blend", scenes.PNG, "'photo.blend' is not a Blender file: it is a PNG image."),
    ("empty.blend", b"", "'empty.blend' is empty."),
    ("cut.blend", scenes.blend()[:700], "is incomplete"),
    ("cut-zstd.blend", scenes.zstd_blend()[:-40], "incomplete"),
    (
        "up.zip",
        scenes.zip_of(("scene.blend", scenes.blend()), ("../../x.py", b"x")),
        "leaves its folder ('../../x.py')",
    ),
    ("abs.zip", scenes.zip_of(("/srv/x.blend", scenes.blend())), "an absolute path ('/srv/x.blend')"),
    ("link.zip", scenes.symlink_zip(), "a symbolic link ('textures/wood.png')"),
    ("pipe.zip", scenes.fifo_zip(), "a special file ('pipe')"),
    ("bomb.zip", scenes.bomb_zip(64 << 20), "unpacks to more than 8 MiB"),
    ("lying.zip", scenes.lying_zip(), "textures/big.raw"),  # its directory says 10 bytes: caught unpacking
    ("many.zip", scenes.many_entries_zip(20_000), "holds 20,001 entries; a scene may hold at most 5,000 files"),
    ("none.zip", scenes.zip_of(("wood.png", scenes.PNG)), "holds no .blend file"),
    ("bad-main.zip", scenes.zip_of(("a.blend", scenes.PNG)), "'a.blend' is not a Blender file: it is a PNG image."),
    ("scene.txt", scenes.blend(), "'scene.txt' is neither a .blend file nor a .zip"),
    ("notazip.zip", scenes.blend(), "not a zip archive"),
]


@pytest.mark.parametrize(("name", "data", "words"), BAD_UPLOADS, ids=[name for name, _, _ in BAD_UPLOADS])
def test_a_bad_upload_is_refused_in_words_and_leaves_nothing_on_disk(
    post_scene: PostScene,
    render_dir: Path,
    settings,
    name: str,
    data: bytes,
    words: str,  # type: ignore[no-untyped-def]
) -> None:
    settings.RENDER_MAX_UNPACKED_BYTES = 8 << 20
    settings.RENDER_MAX_ZIP_ENTRIES = 5000
    errors = refusal(post_scene(name, data))
    assert any(words in error for error in errors), errors
    assert_nothing_left(render_dir)


def test_an_upload_past_the_limit_is_stopped_while_it_streams_and_its_part_removed(
    post_scene: PostScene,
    render_dir: Path,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.RENDER_MAX_UPLOAD_BYTES = 256 * 1024  # the body (300 KiB) is within the limit plus the form's room
    errors = refusal(post_scene("big.blend", scenes.blend() + b"\x00" * 300 * 1024, frames="1-3"))
    assert errors == ["The file is larger than 256 KiB, the most a scene upload may be."]
    assert_nothing_left(render_dir)


def test_a_body_that_says_it_is_too_big_is_refused_before_a_byte_is_stored(
    post_scene: PostScene,
    render_dir: Path,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.RENDER_MAX_UPLOAD_BYTES = 64 * 1024
    response = post_scene("big.blend", b"\x00" * 1024 * 1024, frames="1-3")
    assert refusal(response) == ["The file is larger than 64 KiB, the most a scene upload may be."]
    assert response.context["form"]["frames"].value() == "1-3"  # sent before the file: kept on the form
    assert_nothing_left(render_dir)


def test_the_handler_stops_at_the_chunk_that_passes_the_limit_and_removes_the_part(
    alice: User, render_dir: Path
) -> None:
    upload = Upload(alice, limit=10)
    handler = SceneUploadHandler(upload)
    handler.new_file("scene", "a.blend", "application/octet-stream", None)
    handler.receive_data_chunk(b"BLENDER-v3", 0)
    assert upload.path is not None and upload.path.read_bytes() == b"BLENDER-v3"  # on disk as it arrives
    with pytest.raises(StopUpload):
        handler.receive_data_chunk(b"0", 10)
    assert upload.refusal.startswith("The file is larger than 10 bytes")
    assert_nothing_left(render_dir)


def test_a_second_file_in_the_body_is_refused(alice: User, render_dir: Path) -> None:
    upload = Upload(alice)
    handler = SceneUploadHandler(upload)
    handler.new_file("scene", "a.blend", "application/octet-stream", None)
    handler.receive_data_chunk(scenes.blend(), 0)
    handler.file_complete(len(scenes.blend()))
    with pytest.raises(StopUpload):
        handler.new_file("scene", "b.blend", "application/octet-stream", None)
    assert "one file per job" in upload.refusal
    assert_nothing_left(render_dir)


def test_an_upload_refused_by_the_csrf_check_leaves_nothing(alice: User, render_dir: Path, fleet: None) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    client.cookies["csrftoken"] = "a" * 32  # a cookie but no token: the check reads the body, then refuses
    fields = form_fields()
    fields["scene"] = SimpleUploadedFile("a.blend", scenes.blend())
    assert client.post(reverse("render-job-upload"), fields).status_code == 403
    assert_nothing_left(render_dir)


def test_someone_outside_users_is_refused_before_the_body_is_read(render_dir: Path, fleet: None, roles: None) -> None:
    from tests.factories import make_user

    outsider = Client()
    outsider.force_login(make_user("nadia", []))
    fields = form_fields()
    fields["scene"] = SimpleUploadedFile("a.blend", scenes.blend())
    answer = outsider.post(reverse("render-job-upload"), fields)
    assert answer.status_code == 403 and "cannot start GPU sessions or render jobs" in answer.content.decode()
    assert_nothing_left(render_dir)


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"frames": "30-1"}, "frames", "'30-1' runs backwards: write the first frame first (1-30)."),
        ({"frames": ""}, "frames", "Say which frames to render, e.g. 1-250"),
        ({"frames": "   "}, "frames", "Say which frames to render, e.g. 1-250"),
        ({"frames": "1,,3"}, "frames", "'1,,3' has an empty item between commas."),
        ({"frames": "-3"}, "frames", "'-3': frame numbers cannot be negative."),
        ({"frames": "5--3"}, "frames", "'5--3': frame numbers cannot be negative."),
        ({"frames": "1-3x"}, "frames", "'1-3x' is not a frame, a range or a stepped range"),
        ({"frames": "frames one to ten"}, "frames", "is not a frame, a range or a stepped range"),
        ({"frames": "1-20000"}, "frames", "That is 20,000 frames; a job renders at most 10,000."),
        ({"frames": "1-9000, 9001-10001"}, "frames", "That is 10,001 frames; a job renders at most 10,000."),
        ({"frames": "2000000"}, "frames", "Blender renders frames up to 1,048,574 only"),
        ({"offer": "mig:H200-SXM5-141GB:9g.999gb"}, "offer", "Select a valid choice"),
        ({"resolution_percent": "0"}, "resolution_percent", "greater than or equal to 1"),
        ({"max_slices": "99"}, "max_slices", "at most 4 slices at once"),
        ({"output_format": "JPEG"}, "output_format", "Select a valid choice"),
        # Past PostgreSQL's integer it was a 500; past a job's frames it means nothing.
        ({"chunk_size": "99999999999999"}, "chunk_size", "A chunk holds at most 10,000 frames"),
        ({"chunk_size": "10001"}, "chunk_size", "A chunk holds at most 10,000 frames"),
    ],
)
def test_a_bad_setting_is_refused_on_the_form_and_the_upload_removed(
    post_scene: PostScene, render_dir: Path, overrides: dict[str, str], field: str, words: str
) -> None:
    errors = refusal(post_scene("a.blend", scenes.blend(), **overrides), field)
    assert any(words in error for error in errors), errors
    assert_nothing_left(render_dir)


def test_the_form_offers_the_launch_forms_slices_with_their_prices(alice_client: Client, fleet: None) -> None:
    page = alice_client.get(reverse("render-job-list")).content.decode()
    assert "H200-SXM5-141GB · MIG 1g.18gb" in page
    assert 'name="scene"' in page and page.index('name="frames"') < page.index('name="scene"')
    assert "OpenEXR" in page and "Prices per hour of a slice" in page


def test_render_redirects_to_the_render_jobs_page(alice_client: Client) -> None:
    answer = alice_client.get("/sessions/render/")
    assert answer.status_code == 302 and answer["Location"] == reverse("render-job-list")


def test_a_file_in_another_field_is_skipped_and_the_scene_kept(
    alice_client: Client, render_dir: Path, fleet: None
) -> None:
    fields = form_fields()
    fields["scene"] = SimpleUploadedFile("a.blend", scenes.blend())
    fields["extra"] = SimpleUploadedFile("evil.sh", b"#!/bin/sh\n")
    assert alice_client.post(reverse("render-job-upload"), fields).status_code == 302
    job = RenderJob.objects.get()
    assert stored(render_dir)[-1] == f"{job.folder}/scene/scene.blend"
    assert not any("evil" in path for path in stored(render_dir))


@pytest.fixture
def build_without_openexr() -> Iterator[None]:
    """What a probe on a Blender build without OpenEXR said it writes."""
    cache.set(services.FORMATS_KEY, ["PNG"])
    yield
    cache.delete(services.FORMATS_KEY)


def test_openexr_is_not_offered_where_the_builds_blender_does_not_write_it(
    alice_client: Client, post_scene: PostScene, render_dir: Path, build_without_openexr: None
) -> None:
    page = alice_client.get(reverse("render-job-list")).content.decode()
    assert 'value="PNG"' in page and 'value="OPEN_EXR"' not in page
    assert "This portal's Blender build writes no OpenEXR." in page
    errors = refusal(post_scene("a.blend", scenes.blend(), output_format="OPEN_EXR"), "output_format")
    assert any("Select a valid choice" in error for error in errors), errors
    assert_nothing_left(render_dir)
