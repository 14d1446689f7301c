# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""The render job pages on the real stack: an upload through the form goes to the probe, its page shows the
estimate and confirms it, the job renders, and its page shows the progress, the gallery, each frame and all
of them as one streamed ZIP, for its owner and staff alone. A scene the probe cannot render shows Blender's
own words."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.templatetags.static import static
from django.test import Client
from django.urls import reverse

from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.render.conftest import form_fields, sha256_of, upload_file
from tests.render.leftovers import assert_left_as_found, traces
from tests.render.stack import (  # noqa: F401 (fixtures)
    MIG_OFFER,
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
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"
OFFER = "{gpu_kind}:{gpu_model}:{gpu_profile}".format(**MIG_OFFER)


def uploaded(client: Client, scene: Path, frames: str) -> RenderJob:
    """The scene up in parts, the form sent, and the job unpacked by the default queue's worker."""
    fields = form_fields(frames=frames, resolution_percent="100", chunk_size="2", offer=OFFER)
    data = scene.read_bytes()
    fields.update(upload=upload_file(client, scene.name, data), sha256=sha256_of(data))
    response = client.post(reverse("render-job-upload"), fields)
    job = RenderJob.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("render-job-detail", args=[job.pk])
    wait_for(lambda: state_of(job) != State.UNPACKING, 60, "its unpacking")
    return job


def polled(client: Client, job: RenderJob) -> Any:
    """What the page's estimate region gets when htmx polls it."""
    headers = {"HX-Request": "true", "HX-Target": "render-estimate"}
    response = client.get(reverse("render-job-detail", args=[job.pk]), headers=headers)
    assert response.status_code == 200
    return response


def body(response: Any) -> bytes:
    assert response.status_code == 200, response.status_code
    return b"".join(response.streaming_content)


def results_urls(job: RenderJob, number: int) -> list[str]:
    return [
        reverse("render-job-detail", args=[job.pk]),
        reverse("render-frame-thumbnail", args=[job.pk, number]),
        reverse("render-frame-download", args=[job.pk, number]),
        reverse("render-frames-zip", args=[job.pk]),
    ]


def test_an_upload_is_estimated_confirmed_rendered_and_its_frames_downloaded_by_its_owner_alone(
    render_stack: Path, scenes: Path, alice: User, alice_client: Client, bob: User, staff: User
) -> None:
    job = uploaded(alice_client, scenes / "small.blend", "1-3")
    assert state_of(job) == State.ESTIMATING
    estimating = polled(alice_client, job).content.decode()
    assert 'data-testid="estimating"' in estimating and 'hx-trigger="every 2s"' in estimating
    assert "<html" not in estimating, "only the region, not the page"

    wait_for(lambda: state_of(job) != State.ESTIMATING, 180, "the probe's estimate")
    job.refresh_from_db()
    assert job.state == State.AWAITING_CONFIRMATION, job.failure_message
    assert polled(alice_client, job)["HX-Refresh"] == "true", "the estimate is in: the page loads again"
    shown = alice_client.get(reverse("render-job-detail", args=[job.pk])).content.decode()
    assert "every 2s" not in shown, "no more polling"
    assert "64 × 48 at 100 %" in shown and "CYCLES" in shown and "present" in shown
    assert re.search(r'data-testid="device">CPU<', shown)
    assert "(this slice&#x27;s GPU is simulated)" in shown, "and why"
    assert "<code>small.blend</code>" in shown, "the scene as its owner named it, not our scene.blend"
    assert re.search(r'data-testid="per-frame">\d+(\.\d+)? s <small', shown)
    assert "(frames 1, 2, 3 rendered at 4 samples as the job will)" in shown, "how the estimate was made"
    assert re.search(r'data-testid="per-chunk">\d+(\.\d+)? s more', shown)
    assert re.search(r'data-testid="cost">[\d.,]+ CNY <small class="muted">\(1 slice-minute:', shown)
    confirm_url = reverse("render-job-confirm", args=[job.pk])
    assert f'action="{confirm_url}"' in shown

    assert alice_client.post(confirm_url).status_code == 302
    assert state_of(job) in (State.QUEUED, State.RENDERING, State.DONE)
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 240, "the job to end")
    job.refresh_from_db()
    assert job.state == State.DONE, job.failure_message

    page = alice_client.get(reverse("render-job-detail", args=[job.pk])).content.decode()
    assert f'data-render-progress="/ws/render/{job.pk}/"' in page and static("js/render-progress.js") in page
    assert re.search(r'data-field="frames_done">3</span> of <span data-field="frames_total">3<', page)
    assert re.search(r'<progress max="100" value="100" data-field="percent"', page)
    assert re.search(r'<dt>Cost</dt><dd data-field="cost" data-testid="cost-so-far">[\d.,]+ CNY<', page), "its cost"
    for number in (1, 2, 3):
        assert f'src="{reverse("render-frame-thumbnail", args=[job.pk, number])}"' in page
        assert f'href="{reverse("render-frame-download", args=[job.pk, number])}"' in page
        thumbnail = alice_client.get(reverse("render-frame-thumbnail", args=[job.pk, number]))
        assert thumbnail["Content-Type"] == "image/jpeg" and body(thumbnail).startswith(JPEG_SIGNATURE)
        frame = alice_client.get(reverse("render-frame-download", args=[job.pk, number]))
        assert f'filename="job{job.pk}-frame{number:04d}.png"' in frame["Content-Disposition"]
        assert body(frame).startswith(PNG_SIGNATURE)

    archive = alice_client.get(reverse("render-frames-zip", args=[job.pk]))
    assert archive.streaming and archive["Content-Type"] == "application/zip"
    pieces = list(archive.streaming_content)  # type: ignore[attr-defined]
    assert len([piece for piece in pieces if piece]) > 3, "written as it goes, not built and sent whole"
    with zipfile.ZipFile(io.BytesIO(b"".join(pieces))) as opened:
        assert opened.testzip() is None
        names = opened.namelist()
        assert names == [f"job{job.pk}-frame{number:04d}.png" for number in (1, 2, 3)]
        for name, number in zip(names, (1, 2, 3), strict=True):
            stored = RenderFrame.objects.get(job=job, number=number)
            on_disk = (job.folder_path() / stored.output_path).read_bytes()
            assert opened.read(name) == on_disk and on_disk.startswith(PNG_SIGNATURE)
            assert stored.sha256 == hashlib.sha256(on_disk).hexdigest(), "the store recorded what it was given"

    wait_for(lambda: all(taken.released_at for taken in slices_of(job)), 30, "its slices released")
    before = traces(render_stack, docker=True)
    bob_client = Client()
    bob_client.force_login(bob)
    for url in results_urls(job, 1):
        assert bob_client.get(url).status_code == 404, url
    for action in ("render-job-cancel", "render-job-confirm", "render-job-requeue-failed"):
        assert bob_client.post(reverse(action, args=[job.pk])).status_code == 404, action
    staff_client = Client()
    staff_client.force_login(staff)
    assert body(staff_client.get(reverse("render-frame-download", args=[job.pk, 2]))).startswith(PNG_SIGNATURE)
    assert staff_client.get(reverse("render-job-detail", args=[job.pk])).status_code == 200

    refused = alice_client.post(reverse("render-job-cancel", args=[job.pk]))
    assert refused.status_code == 409 and "This job is already done." in refused.content.decode()
    assert alice_client.get(reverse("render-frame-download", args=[job.pk, 9])).status_code == 404
    assert_left_as_found(before, render_stack)  # bob's tries and the late cancel: the job and its frames as they were


def test_a_scene_the_probe_cannot_render_shows_blenders_own_words_on_its_page(
    render_stack: Path, scenes: Path, alice_client: Client
) -> None:
    job = uploaded(alice_client, scenes / "no-camera.blend", "1")
    wait_for(lambda: state_of(job) != State.ESTIMATING, 180, "the probe")
    assert polled(alice_client, job)["HX-Refresh"] == "true"
    job.refresh_from_db()
    assert job.state == State.FAILED and "camera" in job.failure_message.lower(), job.failure_message
    # Its first line names the file as its owner uploaded it (stored as scene.blend) and Blender's own error.
    assert job.failure_message.splitlines()[0] == (
        "The probe could not render frame 1 of no-camera.blend: "
        "Blender exited with status 1 (Error: Cannot render, no camera)"
    )

    page = alice_client.get(reverse("render-job-detail", args=[job.pk])).content.decode()
    failure = re.search(r'data-testid="failure">(.*?)</p>', page, re.S)
    assert failure and "camera" in failure.group(1).lower(), page
    assert 'data-testid="estimate"' not in page and "every 2s" not in page


def test_staff_cancel_a_job_mid_render_from_its_page_and_its_containers_stop(
    render_stack: Path, scenes: Path, alice: User, alice_client: Client, staff: User
) -> None:
    job = make_job(alice, scenes / "slow.blend", [1, 2], State.AWAITING_CONFIRMATION, chunk_size=2)
    assert alice_client.post(reverse("render-job-confirm", args=[job.pk])).status_code == 302
    wait_for(lambda: state_of(job) == State.RENDERING and containers_of(job), 120, "its container rendering")
    page = alice_client.get(reverse("render-job-detail", args=[job.pk])).content.decode()
    assert f'action="{reverse("render-job-cancel", args=[job.pk])}"' in page

    staff_client = Client()
    staff_client.force_login(staff)
    answer = staff_client.post(reverse("render-job-cancel", args=[job.pk]))

    assert answer.status_code == 302 and answer["Location"] == reverse("render-job-detail", args=[job.pk])
    assert state_of(job) == State.CANCELLED
    wait_for(lambda: not containers_of(job), 30, "its container stopped and removed")
    assert staff_client.post(reverse("render-job-cancel", args=[job.pk])).status_code == 409


def test_a_failed_job_shows_blenders_output_and_its_frames_are_requeued_from_its_page(
    render_stack: Path, scenes: Path, alice: User, alice_client: Client
) -> None:
    job = make_job(alice, scenes / "no-camera.blend", [1, 2], State.AWAITING_CONFIRMATION, chunk_size=2)
    assert alice_client.post(reverse("render-job-confirm", args=[job.pk])).status_code == 302
    wait_for(lambda: state_of(job) in RenderJob.ENDED, 180, "the job to fail")
    assert state_of(job) == State.FAILED
    page = alice_client.get(reverse("render-job-detail", args=[job.pk])).content.decode()
    requeue_url = reverse("render-job-requeue-failed", args=[job.pk])
    assert f'action="{requeue_url}"' in page
    log = re.search(r'data-testid="chunk-log">(.*?)</pre>', page, re.S)
    assert log and "camera" in log.group(1).lower(), page

    assert alice_client.get(requeue_url).status_code == 405, "POST only"
    assert alice_client.post(requeue_url).status_code == 302
    assert state_of(job) in (State.QUEUED, State.RENDERING, State.FAILED)
    assert RenderChunk.objects.filter(job=job).count() == 2, "the frames not done, in a new chunk"
    wait_for(lambda: state_of(job) == State.FAILED, 180, "the re-queued frames to fail again")
    again = alice_client.post(reverse("render-job-confirm", args=[job.pk]))
    assert again.status_code == 409 and "cannot be confirmed" in again.content.decode()
