"""The jobs list shows each job's frames done of total, with a bar, and its cost so far (its slices' started
minutes at their offer's rate, as the job's page and the meter count them), from one count of all the listed
jobs' frames and one look at all their slices: the page's queries do not grow with the number of jobs."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing import seeds
from billing.launch import per_minute
from billing.models import Price
from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest, allocate, release
from sessions.gpus.holders import Holder
from sessions.render import progress
from sessions.render.models import RenderFrame, RenderJob

pytestmark = pytest.mark.django_db
OFFER = {"gpu_kind": "mig", "gpu_profile": "1g.18gb", "gpu_model": "H200-SXM5-141GB"}
REQUEST = SliceRequest("mig", "1g.18gb", "H200")
# The same at every size: the page (the upload form prices each offer), one look at the slices, one count of
# the frames.
MAX_QUERIES = 41


def a_job(owner: User, number: int, state: str = RenderJob.State.RENDERING) -> RenderJob:
    return RenderJob.objects.create(
        owner=owner, state=state, upload_name=f"shot-{number}.blend", folder=f"t{owner.pk}/list{number}",
        main_file="scene.blend", frame_spec="1-2", frames=[1, 2], frame_count=2, queued_at=timezone.now(), **OFFER,
    )  # fmt: skip


def held_for(job: RenderJob, minutes: int) -> None:
    """A slice the job held for ``minutes`` started minutes, then gave back (so the next one fits)."""
    held = allocate(job.owner, REQUEST, holder=Holder.render(job.pk))
    began = timezone.now() - timedelta(hours=1)
    holdings.ended(held.pk, began, began + timedelta(seconds=60 * minutes - 30))
    release(held.pk)


def costs_shown(page: str) -> dict[int, str]:
    rows = re.findall(r'<tr id="render-job-(\d+)".*?data-testid="cost">([^<]*)</td>', page, flags=re.S)
    return {int(pk): text for pk, text in rows}


def money(amount: Decimal) -> str:
    return f"{amount.quantize(Decimal('0.01'), ROUND_HALF_UP):,} {settings.CURRENCY}"


@pytest.mark.parametrize("count", [2, 9])
def test_the_jobs_list_shows_each_jobs_cost_so_far_in_a_fixed_number_of_queries(
    count: int,
    alice: User,
    alice_client: Client,
    fleet: None,
    django_assert_max_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    seeds.ensure(Price)
    rate = per_minute(REQUEST, "on_demand")
    assert rate is not None and rate > 0
    jobs = [a_job(alice, number) for number in range(count)]
    for number, job in enumerate(jobs):
        held_for(job, number + 1)
    waiting = a_job(alice, count, RenderJob.State.AWAITING_CONFIRMATION)  # it has held nothing yet

    with django_assert_max_num_queries(MAX_QUERIES):
        response = alice_client.get(reverse("render-job-list"))

    assert response.status_code == 200
    shown = costs_shown(response.content.decode())
    assert shown == {**{job.pk: money((n + 1) * rate) for n, job in enumerate(jobs)}, waiting.pk: "—"}
    # The list's figure is the job page's.
    assert all(shown[job.pk] == progress.shown(progress.cost_so_far(job)) for job in jobs)


def progress_shown(page: str) -> dict[int, str]:
    """Each row's progress cell as text, its bar's value first: '25|1 of 4'."""
    rows = re.findall(r'<tr id="render-job-(\d+)".*?data-testid="progress">(.*?)</td>', page, flags=re.S)
    shown: dict[int, str] = {}
    for pk, cell in rows:
        bar = re.search(r'<progress max="100" value="(\d+)"', cell)
        words = " ".join(re.sub(r"<[^>]+>", " ", cell).split())
        shown[int(pk)] = f"{bar.group(1)}|{words}" if bar else words
    return shown


@pytest.mark.parametrize("count", [2, 9])
def test_the_jobs_list_shows_frames_done_of_total_with_a_bar_in_a_fixed_number_of_queries(
    count: int,
    alice: User,
    alice_client: Client,
    fleet: None,
    django_assert_max_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    State = RenderJob.State
    rendering = [a_job(alice, number) for number in range(count)]
    for job in rendering:
        RenderFrame.objects.create(job=job, number=1, state=RenderFrame.State.DONE)
        RenderFrame.objects.create(job=job, number=2, state=RenderFrame.State.RENDERING)
    done = a_job(alice, count, State.DONE)
    RenderFrame.objects.bulk_create([RenderFrame(job=done, number=n, state=RenderFrame.State.DONE) for n in (1, 2)])
    failed = a_job(alice, count + 1, State.FAILED)
    RenderFrame.objects.bulk_create([RenderFrame(job=failed, number=n, state=RenderFrame.State.FAILED) for n in (1, 2)])
    waiting = a_job(alice, count + 2, State.AWAITING_CONFIRMATION)
    RenderJob.objects.filter(pk=waiting.pk).update(queued_at=None)

    with django_assert_max_num_queries(MAX_QUERIES):
        page = alice_client.get(reverse("render-job-list")).content.decode()

    assert progress_shown(page) == {
        **{job.pk: "50|50 % 1 of 2" for job in rendering},
        done.pk: "100|100 % 2 of 2",
        failed.pk: "0|0 % 0 of 2",
        waiting.pk: "confirm the estimate",
    }
    assert 'data-render-jobs="/ws/render/"' in page, "the list follows the person's jobs live"
