"""Uploading a scene: in parts (tus), then the form that names it; what becomes a job, how the job is unpacked
off the request, and every bad upload refused in words with nothing left on disk."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from sessions.render import filestore, services, uploads
from sessions.render.models import RenderJob, RenderUpload
from sessions.render.scenefile import size_words
from sessions.render.uploads import owner_folder
from tests.render import scenes
from tests.render.conftest import TUS, begin_upload, form_fields, send_part, sha256_of, stored, unpacked, upload_file
from tests.render.conftest import Upload as PostScene
from tests.render.leftovers import assert_left_as_found, assert_nothing_left, traces

pytestmark = pytest.mark.django_db


def refusal(response, field: str = "upload") -> list[str]:  # type: ignore[no-untyped-def]
    assert response.status_code == 400, response.content.decode()[:2000]
    return list(response.context["form"].errors.get(field, []))


def the_job(response) -> RenderJob:  # type: ignore[no-untyped-def]
    job = RenderJob.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("render-job-detail", args=[job.pk])
    return job


def test_a_blend_becomes_a_job_that_is_checked_off_the_request_in_its_owners_folder(
    post_scene: PostScene, alice: User, alice_client: Client, render_dir: Path
) -> None:
    response = post_scene("My Shot.blend", scenes.zstd_blend("402"), frames="1-30, 45, 50-60x2", samples="64")
    job = the_job(response)
    assert (job.owner, job.state, job.upload_name, job.main_file) == (
        alice,
        "unpacking",
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
    owner, name = job.folder.split("/")
    assert owner == owner_folder(alice) and len(name) == 32  # a keyed hash, then 128 random bits
    assert stored(render_dir) == [owner, job.folder, f"{job.folder}/scene", f"{job.folder}/scene/scene.blend"]
    assert not RenderUpload.objects.exists()  # the upload became the job
    page = alice_client.get(response["Location"]).content.decode()
    assert ">Unpacking</span>" in page and 'data-testid="unpacking"' in page and 'hx-trigger="every 1s"' in page
    job = unpacked(job)
    assert (job.state, job.blender_version, job.scene_bytes) == ("estimating", "4.2", job.upload_bytes)
    again = alice_client.get(response["Location"], HTTP_HX_REQUEST="true", HTTP_HX_TARGET="render-unpacking")
    assert again.status_code == 200 and again["HX-Refresh"] == "true"  # unpacked: the whole page changes


def test_a_jobs_folder_and_its_owners_are_for_the_portals_user_alone(post_scene: PostScene, render_dir: Path) -> None:
    """Nobody else on the host lists or reads them (the render sandbox reaches the scene through its mount)."""
    job = unpacked(the_job(post_scene("a.zip", scenes.zip_of(("shots/a.blend", scenes.blend())))))
    for folder in (job.folder_path().parent, job.folder_path()):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, f"{folder.relative_to(render_dir)}: {folder.stat()}"


def test_a_zip_is_unpacked_by_its_task_beside_its_assets_and_the_archive_removed(
    post_scene: PostScene, render_dir: Path
) -> None:
    data = scenes.zip_of(("shot/main.blend", scenes.blend()), ("shot/tex/wood.png", scenes.PNG))
    job = the_job(post_scene("shot.zip", data, spot="on"))
    assert (job.state, job.blend_files, job.market) == ("unpacking", ["shot/main.blend"], "spot")
    assert (job.folder_path() / "upload.zip").exists() and not job.scene_path().exists()  # nothing unpacked yet
    job = unpacked(job)
    assert (job.state, job.main_file) == ("estimating", "shot/main.blend")
    assert (job.scene_path() / "shot/tex/wood.png").read_bytes() == scenes.PNG
    assert not (job.folder_path() / "upload.zip").exists()
    assert job.scene_sha256 == filestore.scene_checksum(job.scene_path())[0], "what every render worker checks"


def test_the_job_page_shows_how_far_its_unpacking_has_got(post_scene: PostScene, alice_client: Client) -> None:
    job = the_job(post_scene("shot.zip", scenes.zip_of(("a.blend", scenes.blend()))))
    cache.set(f"render:unpacking:{job.pk}", {"phase": "Unpacking", "done": 3 << 20, "total": 4 << 20}, 60)
    region = alice_client.get(
        reverse("render-job-detail", args=[job.pk]), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="render-unpacking"
    ).content.decode()
    assert 'value="75"' in region and "Unpacking: 3.0\xa0MB of 4.0\xa0MB" in region


def test_a_zip_with_several_blends_asks_which_is_the_scene(
    post_scene: PostScene, alice_client: Client, render_dir: Path
) -> None:
    data = scenes.zip_of(("a.blend", scenes.blend()), ("shots/main.blend", scenes.gzip_blend()), ("x.png", scenes.PNG))
    response = post_scene("two.zip", data)
    job = unpacked(the_job(response))
    assert (job.state, job.main_file, job.blend_files) == ("uploaded", "", ["a.blend", "shots/main.blend"])
    page = alice_client.get(response["Location"]).content.decode()
    assert "Say which one is the scene" in page and 'value="shots/main.blend"' in page
    url = reverse("render-job-main-file", args=[job.pk])
    wrong = alice_client.post(url, {"main_file": "x.png"})
    assert wrong.status_code == 400 and "Select a valid choice" in wrong.content.decode()
    assert alice_client.post(url, {"main_file": "shots/main.blend"}).status_code == 302
    job.refresh_from_db()
    assert (job.state, job.main_file) == ("unpacking", "shots/main.blend")  # its task reads the whole file
    job = unpacked(job)
    assert (job.state, job.main_file, job.blender_version) == ("estimating", "shots/main.blend", "2.79")


def test_a_main_file_named_on_the_form_is_used_and_a_wrong_name_refused(
    post_scene: PostScene, render_dir: Path
) -> None:
    data = scenes.zip_of(("a.blend", scenes.blend()), ("b.blend", scenes.blend()))
    assert "The zip holds no 'c.blend'; its .blend files are 'a.blend', 'b.blend'." in refusal(
        post_scene("two.zip", data, main_file="c.blend")
    )
    assert_nothing_left(render_dir)
    job = unpacked(the_job(post_scene("two.zip", data, main_file="b.blend")))
    assert (job.state, job.main_file) == ("estimating", "b.blend")


def test_a_chosen_main_file_that_is_no_blend_is_refused_and_the_job_waits(
    post_scene: PostScene, alice_client: Client, render_dir: Path
) -> None:
    job = unpacked(the_job(post_scene("two.zip", scenes.zip_of(("a.blend", scenes.blend()), ("b.blend", scenes.PNG)))))
    before = traces(render_dir)
    answer = alice_client.post(reverse("render-job-main-file", args=[job.pk]), {"main_file": "b.blend"})
    assert answer.status_code == 400 and "is not a Blender file: it is a PNG image" in answer.content.decode()
    assert_left_as_found(before, render_dir)  # still uploaded, its files as they were, no task sent


# Refused when the form is sent: what a first look finds (the hash, the .blend's first bytes, the zip's directory).
FORM_REFUSALS = [
    ("photo.blend", scenes.PNG, "'photo.blend' is not a Blender file: it is a PNG image."),
    ("empty.blend", b"", "'empty.blend' is empty."),
    ("cut-zstd.blend", scenes.zstd_blend()[:-40], "incomplete"),  # one zstd frame: its start is its end
    (
        "up.zip",
        scenes.zip_of(("scene.blend", scenes.blend()), ("../../x.py", b"x")),
        "leaves its folder ('../../x.py')",
    ),
    ("abs.zip", scenes.zip_of(("/srv/x.blend", scenes.blend())), "an absolute path ('/srv/x.blend')"),
    ("link.zip", scenes.symlink_zip(), "a symbolic link ('textures/wood.png')"),
    ("pipe.zip", scenes.fifo_zip(), "a special file ('pipe')"),
    ("bomb.zip", scenes.bomb_zip(64 << 20), "unpacks to more than 8 MiB"),
    ("many.zip", scenes.many_entries_zip(20_000), "holds 20,001 entries; a scene may hold at most 5,000 files"),
    ("none.zip", scenes.zip_of(("wood.png", scenes.PNG)), "holds no .blend file"),
    ("notazip.zip", scenes.blend(), "not a zip archive"),
]


@pytest.mark.parametrize(("name", "data", "words"), FORM_REFUSALS, ids=[name for name, _, _ in FORM_REFUSALS])
def test_a_bad_upload_is_refused_on_the_form_in_words_and_leaves_nothing_on_disk(
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


def test_a_zip_of_zeros_at_1000_to_1_is_refused_before_anything_is_unpacked(
    post_scene: PostScene, render_dir: Path
) -> None:
    bomb = scenes.bomb_zip(64 << 20)
    assert 900 < (64 << 20) / len(bomb) < 1100
    [error] = refusal(post_scene("zeros.zip", bomb))
    assert (
        error.startswith("'scene.blend' in the zip unpacks to 1,0") and "times its packed size (64 MiB from 6" in error
    )
    assert "a scene's zip may unpack to at most 100 times. Files that compress that well are mostly empty" in error
    assert_nothing_left(render_dir)


def test_the_compression_ratio_limit_is_a_setting(post_scene: PostScene, render_dir: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.RENDER_MAX_COMPRESSION_RATIO = 2000
    job = the_job(post_scene("zeros.zip", scenes.bomb_zip(4 << 20)))
    assert job.state == "unpacking"


# Refused by the unpacking task: what only reading the whole file shows. The job fails with the words.
UNPACK_REFUSALS = [
    ("cut.blend", scenes.blend()[:700], "is incomplete"),
    ("lying.zip", scenes.lying_zip(), "textures/big.raw"),  # its directory says 10 bytes: caught unpacking
    ("bad-main.zip", scenes.zip_of(("a.blend", scenes.PNG)), "'a.blend' is not a Blender file: it is a PNG image."),
]


@pytest.mark.parametrize(("name", "data", "words"), UNPACK_REFUSALS, ids=[name for name, _, _ in UNPACK_REFUSALS])
def test_a_scene_its_unpacking_refuses_fails_its_job_in_words_and_its_files_go(
    post_scene: PostScene, render_dir: Path, name: str, data: bytes, words: str
) -> None:
    job = unpacked(the_job(post_scene(name, data)))
    assert job.state == "failed" and words in job.failure_message, job.failure_message
    assert job.files_removed_at is not None and stored(render_dir) == []


def test_a_cancel_while_the_scene_unpacks_wins_and_its_files_go(
    post_scene: PostScene, alice_client: Client, render_dir: Path
) -> None:
    job = the_job(post_scene("shot.zip", scenes.zip_of(("a.blend", scenes.blend()))))
    assert alice_client.post(reverse("render-job-cancel", args=[job.pk])).status_code == 302
    job = unpacked(job)  # the task, already running when the cancel came, ends
    assert job.state == "cancelled" and stored(render_dir) == []


def test_two_unpacking_runs_of_one_job_unpack_it_once(post_scene: PostScene, render_dir: Path) -> None:
    from sessions.render import unpacking

    job = the_job(post_scene("shot.zip", scenes.zip_of(("a.blend", scenes.blend()))))
    assert unpacking.claim(job.pk)
    assert not unpacking.claim(job.pk)  # another run has it and was heard of just now
    assert unpacked(job).state == "unpacking"  # a second task sent meanwhile does nothing
    RenderJob.objects.filter(pk=job.pk).update(unpack_heard_at=timezone.now() - unpacking.SILENCE * 2)
    assert unpacked(job).state == "estimating"  # its worker died: a task sent again unpacks it, from the start


def test_a_file_whose_sha256_differs_from_the_browsers_is_refused_and_removed(
    post_scene: PostScene, render_dir: Path
) -> None:
    errors = refusal(post_scene("a.blend", scenes.blend(), sha256="0" * 64))
    assert errors == [
        "What arrived of 'a.blend' is not the file you chose (its SHA-256 differs: the file changed, or it was "
        "damaged on its way); upload it again."
    ]
    assert_nothing_left(render_dir)


def test_the_sha256_is_right_when_parts_reach_a_process_that_did_not_see_the_ones_before(
    alice_client: Client, render_dir: Path, fleet: None
) -> None:
    data = scenes.blend() + bytes(300_000)
    token = begin_upload(alice_client, "a.blend", len(data))["Location"].rstrip("/").rsplit("/", 1)[1]
    assert send_part(alice_client, token, 0, data[:196_608]).status_code == 204
    uploads.DIGESTS = uploads.RunningDigests()  # as if the next part reached another process (or after a restart)
    assert send_part(alice_client, token, 196_608, data[196_608:]).status_code == 204
    assert RenderUpload.objects.get().sha256 == sha256_of(data)


def test_parts_resume_from_the_offset_the_server_has_and_a_stale_one_is_refused(
    alice_client: Client, render_dir: Path, fleet: None
) -> None:
    data = scenes.blend()
    created = begin_upload(alice_client, "a.blend", len(data))
    token = created["Location"].rstrip("/").rsplit("/", 1)[1]
    assert send_part(alice_client, token, 0, data[:100]).status_code == 204
    head = alice_client.head(reverse("render-upload-part", args=[token]), headers=TUS)
    assert (head.status_code, head["Upload-Offset"], head["Upload-Length"]) == (200, "100", str(len(data)))
    stale = send_part(alice_client, token, 0, data[:100])
    assert stale.status_code == 409 and "starts at byte 0, but 100 bytes are stored" in stale.content.decode()
    assert send_part(alice_client, token, 100, data[100:]).status_code == 204
    assert (uploads.stored_path(RenderUpload.objects.get())).read_bytes() == data


def test_an_incomplete_upload_is_refused_on_the_form_and_kept_to_resume(
    alice_client: Client, render_dir: Path, fleet: None
) -> None:
    data = scenes.blend()
    created = begin_upload(alice_client, "a.blend", len(data))
    token = created["Location"].rstrip("/").rsplit("/", 1)[1]
    send_part(alice_client, token, 0, data[:100])
    answer = alice_client.post(
        reverse("render-job-upload"), {**form_fields(), "upload": token, "sha256": sha256_of(data)}
    )
    assert refusal(answer) == [
        f"Only 100 bytes of {size_words(len(data))} of 'a.blend' arrived; let the upload finish."
    ]
    assert RenderUpload.objects.get().offset == 100


@pytest.mark.parametrize(
    ("name", "length", "status", "words"),
    [
        ("scene.txt", 100, 400, "'scene.txt' is neither a .blend file nor a .zip"),
        ("huge.blend", (2 << 30) + 1, 413, "The file is larger than 2 GiB, the most a scene may be."),
    ],
)
def test_an_upload_that_cannot_be_a_scene_is_refused_before_a_byte_is_sent(
    alice_client: Client, render_dir: Path, name: str, length: int, status: int, words: str
) -> None:
    answer = begin_upload(alice_client, name, length)
    assert answer.status_code == status and words in answer.content.decode()
    assert_nothing_left(render_dir)


def test_a_part_larger_than_the_part_limit_is_refused(alice_client: Client, render_dir: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.RENDER_UPLOAD_PART_BYTES = 64 * 1024
    token = begin_upload(alice_client, "a.blend", 200_000)["Location"].rstrip("/").rsplit("/", 1)[1]
    answer = send_part(alice_client, token, 0, bytes(64 * 1024 + 1))
    assert answer.status_code == 413 and "A part may hold at most 64 KiB." in answer.content.decode()
    assert RenderUpload.objects.get().offset == 0


def test_someone_elses_upload_answers_as_one_that_does_not_exist(
    alice_client: Client, bob_client: Client, render_dir: Path, fleet: None
) -> None:
    token = upload_file(alice_client, "a.blend", scenes.blend())
    url = reverse("render-upload-part", args=[token])
    before = traces(render_dir)
    assert bob_client.head(url, headers=TUS).status_code == 404
    assert send_part(bob_client, token, len(scenes.blend()), b"x").status_code == 404
    assert bob_client.delete(url, headers=TUS).status_code == 404
    answer = bob_client.post(
        reverse("render-job-upload"), {**form_fields(), "upload": token, "sha256": sha256_of(scenes.blend())}
    )
    assert "The upload is gone" in refusal(answer)[0]
    assert_left_as_found(before, render_dir)


def test_an_upload_cancelled_by_its_owner_is_removed(alice_client: Client, render_dir: Path, fleet: None) -> None:
    token = upload_file(alice_client, "a.blend", scenes.blend())
    assert alice_client.delete(reverse("render-upload-part", args=[token]), headers=TUS).status_code == 204
    assert_nothing_left(render_dir)


def test_an_upload_nobody_adds_to_expires(alice_client: Client, render_dir: Path, fleet: None, settings) -> None:  # type: ignore[no-untyped-def]
    upload_file(alice_client, "a.blend", scenes.blend())
    assert uploads.remove_expired() == 0
    RenderUpload.objects.update(updated_at=timezone.now() - timedelta(hours=settings.RENDER_UPLOAD_EXPIRY_HOURS + 1))
    assert uploads.remove_expired() == 1
    assert_nothing_left(render_dir)


def test_a_part_without_the_csrf_token_is_refused_and_nothing_written(
    alice: User, render_dir: Path, fleet: None
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert begin_upload(client, "a.blend", 10).status_code == 403
    assert_nothing_left(render_dir)


def test_an_anonymous_upload_and_one_by_someone_outside_users_are_refused(render_dir: Path, roles: None) -> None:
    from tests.factories import make_user

    anonymous = begin_upload(Client(), "a.blend", 10)
    assert anonymous.status_code == 403 and anonymous.content.decode().strip() == "Log in to upload a scene."
    outsider = Client()
    outsider.force_login(make_user("nadia", []))
    answer = begin_upload(outsider, "a.blend", 10)
    assert answer.status_code == 403 and "cannot start GPU sessions or render jobs" in answer.content.decode()
    assert_nothing_left(render_dir)


def test_a_request_that_is_not_tus_is_told_which_protocol_this_is(alice_client: Client, render_dir: Path) -> None:
    answer = alice_client.post(reverse("render-upload-create"), b"", content_type="", HTTP_UPLOAD_LENGTH="10")
    assert answer.status_code == 412 and answer["Tus-Version"] == "1.0.0"
    options = alice_client.options(reverse("render-upload-create"))
    assert (options.status_code, options["Tus-Extension"], options["Tus-Max-Size"]) == (
        204,
        "creation,termination",
        str(2 << 30),
    )


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
def test_a_bad_setting_is_refused_on_the_form_and_the_upload_kept_for_the_corrected_form(
    post_scene: PostScene, alice_client: Client, render_dir: Path, overrides: dict[str, str], field: str, words: str
) -> None:
    answer = post_scene("a.blend", scenes.blend(), **overrides)
    errors = refusal(answer, field)
    assert any(words in error for error in errors), errors
    assert not RenderJob.objects.exists() and RenderUpload.objects.count() == 1
    assert 'data-testid="uploaded"' in answer.content.decode()  # the page says the file need not go up again
    kept = answer.context["form"]
    corrected = alice_client.post(
        reverse("render-job-upload"),
        {**form_fields(), "upload": kept["upload"].value(), "sha256": kept["sha256"].value()},
    )
    assert the_job(corrected).upload_name == "a.blend"


def test_the_form_without_an_upload_asks_for_the_file(alice_client: Client, render_dir: Path, fleet: None) -> None:
    answer = alice_client.post(reverse("render-job-upload"), form_fields())
    assert refusal(answer) == ["Choose the scene's file (.blend, or a .zip with its assets) to upload it."]


def test_the_form_offers_the_launch_forms_slices_with_their_prices(alice_client: Client, fleet: None) -> None:
    page = alice_client.get(reverse("render-job-list")).content.decode()
    assert "H200-SXM5-141GB · MIG 1g.18gb" in page
    assert 'id="scene-file"' in page and page.index('name="frames"') < page.index('id="scene-file"')
    assert f'data-scene-upload="{reverse("render-upload-create")}"' in page and 'data-part-bytes="8388608"' in page
    assert "OpenEXR" in page and "Prices per hour of a slice" in page


def test_the_upload_route_is_the_one_the_public_entry_holds_to_a_parts_size(settings) -> None:  # type: ignore[no-untyped-def]
    from portal import entrylimits

    assert reverse("render-upload-create") == entrylimits.UPLOAD_PATH
    assert reverse("render-upload-part", args=["a" * 32]).startswith(entrylimits.UPLOAD_PATH)
    assert settings.SESSION_COOKIE_NAME == entrylimits.SESSION_COOKIE
    assert settings.ENTRY_LIMITS.upload_route >= settings.RENDER_UPLOAD_PART_BYTES


def test_render_redirects_to_the_render_jobs_page(alice_client: Client) -> None:
    answer = alice_client.get("/sessions/render/")
    assert answer.status_code == 302 and answer["Location"] == reverse("render-job-list")


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
