"""A render job's results without the render stack: the frame a row names, and nothing outside the job's
folder; the ZIP written in pieces as it is read, each frame stored whole."""

from __future__ import annotations

import io
import secrets
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.http import Http404
from django.test import Client
from django.urls import reverse

from sessions.render import results
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.render.leftovers import assert_left_as_found, traces

pytestmark = pytest.mark.django_db
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def finished_job(owner: User, frames: dict[int, bytes]) -> RenderJob:
    job = RenderJob.objects.create(
        owner=owner,
        state=RenderJob.State.DONE,
        upload_name="shot.blend",
        folder=f"t{owner.pk}/{secrets.token_hex(8)}",
        frame_spec="1-9",
        frames=sorted(frames),
        frame_count=len(frames),
        gpu_kind="mig",
    )
    (job.folder_path() / "frames").mkdir(parents=True)
    for number, data in frames.items():
        (job.folder_path() / "frames" / f"{number:04d}.png").write_bytes(data)
        RenderFrame.objects.create(
            job=job, number=number, state=RenderFrame.State.DONE, output_path=f"frames/{number:04d}.png"
        )
    return job


def test_the_zip_streams_every_frame_in_pieces_and_each_reads_back_whole(alice: User, render_dir: Path) -> None:
    big = PNG_SIGNATURE + secrets.token_bytes(3 * results.BLOCK + 17)
    job = finished_job(alice, {1: big, 2: PNG_SIGNATURE + b"small"})
    pieces = list(results.zip_stream(job, results.done_frames(job)))
    assert len([piece for piece in pieces if piece]) >= 5 and max(map(len, pieces)) <= results.BLOCK + 1024
    with zipfile.ZipFile(io.BytesIO(b"".join(pieces))) as opened:
        assert opened.testzip() is None
        assert [info.compress_type for info in opened.infolist()] == [zipfile.ZIP_STORED] * 2
        assert opened.read(f"job{job.pk}-frame0001.png") == big
        assert opened.read(f"job{job.pk}-frame0002.png") == PNG_SIGNATURE + b"small"


def test_a_frame_row_naming_a_file_outside_the_job_folder_is_not_served(alice: User, render_dir: Path) -> None:
    job = finished_job(alice, {1: PNG_SIGNATURE})
    (render_dir / "secret.txt").write_text("not a frame")
    RenderFrame.objects.filter(job=job, number=1).update(output_path="../../secret.txt")
    with pytest.raises(Http404):
        results.open_inside(job, "../../secret.txt")
    client = Client()
    client.force_login(alice)
    assert client.get(reverse("render-frame-download", args=[job.pk, 1])).status_code == 404
    with zipfile.ZipFile(io.BytesIO(client.get(reverse("render-frames-zip", args=[job.pk])).getvalue())) as opened:
        assert opened.namelist() == []


def test_a_frame_or_thumbnail_swapped_for_a_link_is_not_served_even_one_to_a_file_of_the_job(
    alice: User, render_dir: Path
) -> None:
    """A run still going may swap its frames for links (its output folder is the sandbox's): a file is served
    only as a file of its own, opened without following a link, so no swap can make it read anything else."""
    job = finished_job(alice, {1: PNG_SIGNATURE + b"one", 2: PNG_SIGNATURE + b"two"})
    (job.folder_path() / "frames" / "0001.png").unlink()
    (job.folder_path() / "frames" / "0001.png").symlink_to("0002.png")
    (job.folder_path() / "thumbnails").mkdir()
    (job.folder_path() / "thumbnails" / "0002.jpg").symlink_to("../frames/0002.png")
    RenderFrame.objects.filter(job=job, number=2).update(thumbnail_path="thumbnails/0002.jpg")
    client = Client()
    client.force_login(alice)
    assert client.get(reverse("render-frame-download", args=[job.pk, 1])).status_code == 404
    assert client.get(reverse("render-frame-thumbnail", args=[job.pk, 2])).status_code == 404
    assert b"".join(client.get(reverse("render-frame-download", args=[job.pk, 2]))) == PNG_SIGNATURE + b"two"
    with zipfile.ZipFile(io.BytesIO(client.get(reverse("render-frames-zip", args=[job.pk])).getvalue())) as opened:
        assert opened.namelist() == [f"job{job.pk}-frame0002.png"]


def test_a_frame_is_served_privately_and_one_unfinished_or_without_thumbnail_is_404(
    alice: User, render_dir: Path
) -> None:
    job = finished_job(alice, {1: PNG_SIGNATURE})
    RenderFrame.objects.create(job=job, number=2, state=RenderFrame.State.FAILED, output_path="frames/0001.png")
    client = Client()
    client.force_login(alice)
    served = client.get(reverse("render-frame-download", args=[job.pk, 1]))
    assert served.status_code == 200 and "private" in served["Cache-Control"], "no shared cache keeps it"
    assert client.get(reverse("render-frame-download", args=[job.pk, 2])).status_code == 404
    assert client.get(reverse("render-frame-thumbnail", args=[job.pk, 1])).status_code == 404


def test_another_persons_frames_thumbnails_zip_and_log_answer_404_and_change_nothing(
    alice: User, bob: User, render_dir: Path
) -> None:
    job = finished_job(alice, {1: PNG_SIGNATURE + b"alice's frame"})
    RenderJob.objects.filter(pk=job.pk).update(queued_at=job.created_at)  # rendered: its page shows its progress
    (job.folder_path() / "thumbnails").mkdir()
    (job.folder_path() / "thumbnails" / "0001.jpg").write_bytes(b"\xff\xd8\xff alice's thumbnail")
    RenderFrame.objects.filter(job=job, number=1).update(thumbnail_path="thumbnails/0001.jpg")
    RenderChunk.objects.create(
        job=job,
        index=0,
        frames=[1],
        state=RenderChunk.State.DONE,
        attempts=1,
        finished_at=job.created_at,
        log_excerpt="Fra:1 a log line of alice",
    )
    seen = [
        reverse("render-job-detail", args=[job.pk]),
        reverse("render-frame-thumbnail", args=[job.pk, 1]),
        reverse("render-frame-download", args=[job.pk, 1]),
        reverse("render-frames-zip", args=[job.pk]),
    ]
    owner, other = Client(), Client()
    owner.force_login(alice)
    other.force_login(bob)
    assert "a log line of alice" in owner.get(seen[0]).content.decode(), "the owner sees the log"
    assert [owner.get(url).status_code for url in seen] == [200] * 4
    before = traces(render_dir)

    for url in seen:
        answer = other.get(url)
        assert answer.status_code == 404, url
        assert b"alice" not in b"".join(answer) and b"shot.blend" not in b"".join(answer), url
    for action in ("render-job-cancel", "render-job-confirm", "render-job-requeue-failed", "render-job-main-file"):
        assert other.post(reverse(action, args=[job.pk])).status_code == 404, action
    assert other.get(reverse("render-frame-download", args=[job.pk + 1, 1])).status_code == 404, "nor anyone's"
    assert_left_as_found(before, render_dir)
