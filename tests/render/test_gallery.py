"""A finished job's gallery, a page of thumbnails at a time: a job of thousands of frames once listed every one
of them on its page. Real links page through it without JavaScript; htmx swaps the gallery alone."""

from __future__ import annotations

import re
import secrets

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from sessions.render import results
from sessions.render.models import RenderFrame, RenderJob

pytestmark = pytest.mark.django_db
FRAMES = 130


def a_job_of_many_frames(owner: User, count: int = FRAMES) -> RenderJob:
    frames = list(range(1, count + 1))
    job = RenderJob.objects.create(
        owner=owner,
        state=RenderJob.State.DONE,
        upload_name="shot.blend",
        folder=f"t{owner.pk}/{secrets.token_hex(8)}",
        frame_spec=f"1-{count}",
        frames=frames,
        frame_count=count,
        gpu_kind="mig",
    )
    RenderFrame.objects.bulk_create(
        RenderFrame(job=job, number=n, state="done", output_path=f"frames/{n:04d}.png", thumbnail_path=f"t/{n}.jpg")
        for n in frames
    )
    return job


def shown_frames(page: str) -> list[int]:
    return [int(number) for number in re.findall(r'alt="Frame (\d+)"', page)]


def test_a_jobs_page_shows_one_page_of_its_frames_with_links_to_the_others(alice: User) -> None:
    job = a_job_of_many_frames(alice)
    client = Client()
    client.force_login(alice)
    detail = reverse("render-job-detail", args=[job.pk])

    first = client.get(detail).content.decode()
    second = client.get(detail, {"page": 2}).content.decode()
    last = client.get(detail, {"page": 3}).content.decode()

    per_page = results.GALLERY_FRAMES
    assert shown_frames(first) == list(range(1, per_page + 1))
    assert shown_frames(second) == list(range(per_page + 1, 2 * per_page + 1))
    assert shown_frames(last) == list(range(2 * per_page + 1, FRAMES + 1))
    assert f"Download all {FRAMES} frames (ZIP)" in first, "the ZIP still holds every frame"
    assert f"Frames 1–{per_page} of {FRAMES}" in first
    # Real addresses, so the pages work without JavaScript; htmx fetches the same ones into the gallery alone.
    second_page = f"{detail}?page=2"
    assert f'href="{second_page}#render-gallery"' in first and f'hx-get="{second_page}"' in first
    assert 'hx-target="#render-gallery"' in first and 'hx-push-url="true"' in first
    assert f'href="{detail}?page=1#render-gallery"' in second and f'href="{detail}?page=3#render-gallery"' in second
    assert "Next" not in last.split('id="render-gallery"')[1]
    # A page past the end or not a number shows the last or the first, never an error.
    assert shown_frames(client.get(detail, {"page": 99}).content.decode()) == shown_frames(last)
    assert shown_frames(client.get(detail, {"page": "x"}).content.decode()) == shown_frames(first)


def test_htmx_gets_only_the_gallery_region_in_a_few_queries(
    alice: User,
    django_assert_max_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    job = a_job_of_many_frames(alice)
    client = Client()
    client.force_login(alice)
    headers = {"HX-Request": "true", "HX-Target": "render-gallery"}

    # The session, its person, the job, two for the finance permission (the context processor), the frames'
    # count and their page: the same for page 2 of 130 frames as of 4,660.
    with django_assert_max_num_queries(7):
        answer = client.get(reverse("render-job-detail", args=[job.pk]), {"page": 2}, headers=headers)

    region = answer.content.decode()
    assert region.lstrip().startswith('<section class="card" id="render-gallery"') and "<html" not in region
    assert shown_frames(region)[0] == results.GALLERY_FRAMES + 1


def test_someone_elses_gallery_is_not_found_by_page_or_by_htmx(alice: User, bob: User) -> None:
    job = a_job_of_many_frames(alice, 3)
    client = Client()
    client.force_login(bob)
    detail = reverse("render-job-detail", args=[job.pk])
    assert client.get(detail, {"page": 1}).status_code == 404
    assert (
        client.get(detail, {"page": 1}, headers={"HX-Request": "true", "HX-Target": "render-gallery"}).status_code
        == 404
    )
