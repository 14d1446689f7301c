"""Render progress: who may follow which job's socket, what a push reaches, and the figures it carries
(frames done, average time per frame, ETA, cost so far at the offer's rate, the latest thumbnail)."""

from __future__ import annotations

from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.utils import timezone

from billing import seeds
from billing.launch import per_minute
from billing.models import Price
from portal import push
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.render import progress, services
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.runtime.blender_log import FrameSaved, Marked, Progress

pytestmark = pytest.mark.django_db(transaction=True)
OFFER = {"gpu_kind": "mig", "gpu_profile": "1g.18gb", "gpu_model": "H200-SXM5-141GB"}


def a_job(owner: User, frames: list[int], state: str = RenderJob.State.RENDERING) -> RenderJob:
    return RenderJob.objects.create(
        owner=owner,
        state=state,
        upload_name="scene.blend",
        folder=f"t{owner.pk}/progress",
        main_file="scene.blend",
        frame_spec="",
        frames=frames,
        frame_count=len(frames),
        **OFFER,
    )


async def test_a_jobs_socket_is_for_its_owner_and_staff_and_nobody_else(alice: User, bob: User, staff: User) -> None:
    from tests.helpers.websockets import open_socket

    job = await database_sync_to_async(a_job)(alice, [1, 2])
    path = f"/ws/render/{job.pk}/"
    _, opened, code = await open_socket(path)
    assert (opened, code) == (False, 4401)
    _, opened, code = await open_socket(path, bob)
    assert (opened, code) == (False, 4403), "bob may not follow alice's job"
    _, opened, code = await open_socket("/ws/render/999999/", bob)
    assert (opened, code) == (False, 4403), "a job that does not exist looks the same as someone else's"

    alice_job, opened, _ = await open_socket(path, alice)
    staff_job, staff_opened, _ = await open_socket(path, staff)
    alice_all, all_opened, _ = await open_socket("/ws/render/", alice)
    bob_all, _, _ = await open_socket("/ws/render/", bob)
    assert opened and staff_opened and all_opened
    await sync_to_async(push.render_progress)(alice.pk, job.pk, {"type": "render.progress", "job": job.pk})
    for socket in (alice_job, staff_job, alice_all):
        assert (await socket.receive_json_from(timeout=5))["job"] == job.pk
    assert await bob_all.receive_nothing(timeout=0.5), "bob's list hears nothing of alice's jobs"
    for socket in (alice_job, staff_job, alice_all, bob_all):
        await socket.disconnect()


def test_the_figures_count_done_frames_average_their_time_and_price_the_held_minutes(
    alice: User,
    settings,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from tests.gpus.conftest import use_fleet

    seeds.ensure(Price)
    use_fleet(settings, "r: 1xH200:mig")
    settings.RENDER_DIR = tmp_path
    job = a_job(alice, [1, 2, 3, 4])
    began = timezone.now() - timedelta(seconds=90)
    RenderJob.objects.filter(pk=job.pk).update(started_at=began)
    RenderChunk.objects.create(job=job, index=0, frames=[1, 2, 3, 4], state="rendering", started_at=began)
    for number, seconds in ((1, 20), (2, 50)):  # 20 s, then 30 s more
        RenderFrame.objects.create(job=job, number=number, state="done", finished_at=began + timedelta(seconds=seconds))
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in (3, 4)])
    held = allocate(alice, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))
    holdings.ended(held.pk, began, began + timedelta(seconds=61))  # two started minutes

    figures = progress.snapshot(RenderJob.objects.get(pk=job.pk))

    assert (figures["frames_done"], figures["frames_total"], figures["percent"]) == (2, 4, 50)
    assert figures["seconds_per_frame"] == 25.0
    assert figures["eta_seconds"] == 50.0  # two frames left at 25 s, on the one slice rendering
    assert (figures["per_frame_shown"], figures["eta_shown"]) == ("25 s", "50 s")
    rate = per_minute(SliceRequest("mig", "1g.18gb", "H200"), "on_demand")
    assert rate is not None and rate > 0
    assert progress.cost_so_far(job) == 2 * rate
    assert figures["cost"] == f"{(2 * rate).quantize(Decimal('0.01'), ROUND_HALF_UP):,} {settings.CURRENCY}"


def test_a_chunk_run_pushes_each_frames_first_sample_and_every_saved_frame(alice: User) -> None:
    job = a_job(alice, [1, 2])
    saved: list[str] = []
    run = progress.ChunkRun(job, on_saved=saved.append)
    line = "Fra:1 Mem:9M | Time:00:00.40 | Remaining:00:00.03 | Scene, ViewLayer | Sample {}/4"
    run.line(line.format(1), Progress(1, 0.4, 1, 4, "Sample 1/4"))
    first_push = run.last_push
    run.line(line.format(2), Progress(1, 0.5, 2, 4, "Sample 2/4"))
    assert run.last_push == first_push, "a second sample line within half a second is not pushed"
    run.line("Saved: '/out/frame_000001.png'", FrameSaved(1, "/out/frame_000001.png"))
    assert saved == ["frame_000001.png"] and run.last_push > first_push
    assert run.live()["log_tail"][-1] == "Saved: '/out/frame_000001.png'"
    run.line('gpu-portal-0123456789abcdef device "CPU"', Marked("device", "CPU"))
    assert run.live()["device"] == "CPU", "where Cycles renders, as our marked line said"
    assert not any("gpu-portal-" in line for line in run.live()["log_tail"]), "the run's mark stays out of the tail"
    assert (run.live()["frame"], run.live()["samples"]) == (1, 4)


def test_chunks_take_the_frames_in_order_the_last_one_shorter() -> None:
    assert services.split([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert services.split([7], 10) == [[7]]
    assert services.split([1, 2, 3], 0) == [[1], [2], [3]]


def queued_job_page(owner: User) -> tuple[RenderJob, Any, str]:
    """A queued two-frame job rendering, its owner logged in, and its page's address."""
    from django.test import Client
    from django.urls import reverse

    job = a_job(owner, [1, 2])
    RenderJob.objects.filter(pk=job.pk).update(queued_at=timezone.now())
    client = Client()
    client.force_login(owner)
    return job, client, reverse("render-job-detail", args=[job.pk])


def test_the_job_page_shows_the_log_tail_its_running_chunk_pushed_as_it_loads(
    alice: User,
    settings,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    settings.RENDER_DIR = tmp_path
    job, client, page = queued_job_page(alice)
    assert tail_shown(client.get(page).content.decode()) == "", "nothing pushed yet: an empty tail"

    run = progress.ChunkRun(job, on_saved=lambda name: None)
    run.line("Blender 3.4.1 (hash abc built 2023-01-01)", None)
    run.line("Fra:1 Mem:9M | Time:00:00.40 | Scene, ViewLayer | Sample 1/4", Progress(1, 0.4, 1, 4, "Sample 1/4"))

    shown = tail_shown(client.get(page).content.decode())
    assert shown.splitlines() == ["Blender 3.4.1 (hash abc built 2023-01-01)", run.tail[-1]]
    assert progress.snapshot(job)["log_tail"] == run.tail, "and what the socket sends with any later change"


def test_the_job_page_shows_the_sample_reached_and_where_cycles_renders_as_it_loads(
    alice: User,
    settings,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Blender prints a sample line every few seconds at most (far fewer with many samples): a page loaded
    between two shows what the last one said, not dashes until the next."""
    settings.RENDER_DIR = tmp_path
    job, client, page = queued_job_page(alice)
    assert current_frame_shown(client.get(page).content.decode()) == "sample — of — · on —", "nothing pushed yet"

    run = progress.ChunkRun(job, on_saved=lambda name: None)
    run.line('gpu-portal-x device "CPU"', Marked("device", "CPU"))
    run.line("Fra:1 Mem:9M | Time:00:36.96 | Scene, ViewLayer | Sample 257/512", Progress(1, 37.0, 257, 512, ""))

    assert current_frame_shown(client.get(page).content.decode()) == "sample 257 of 512 · on CPU"
    RenderJob.objects.filter(pk=job.pk).update(state=RenderJob.State.CANCELLED, finished_at=timezone.now())
    assert progress.snapshot(RenderJob.objects.get(pk=job.pk))["sample"] is None, "only while it renders"


def current_frame_shown(page: str) -> str:
    import html
    import re

    found = re.search(r'data-testid="current-frame">(.*?)</dd>', page, re.S)
    assert found, "the page has the current frame's figures"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).split())


def test_once_no_chunk_runs_the_job_page_shows_the_end_of_the_last_chunks_output(
    alice: User, settings, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client
    from django.urls import reverse

    settings.RENDER_DIR = tmp_path
    job = a_job(alice, [1, 2], RenderJob.State.DONE)
    RenderJob.objects.filter(pk=job.pk).update(queued_at=timezone.now())
    earlier, last = timezone.now() - timedelta(minutes=2), timezone.now()
    RenderChunk.objects.create(job=job, index=0, frames=[1], state="done", finished_at=earlier, log_excerpt="first")
    lines = [f"line {n} <b>" for n in range(30)]
    RenderChunk.objects.create(
        job=job, index=1, frames=[2], state="done", finished_at=last, log_excerpt="\n".join(lines)
    )
    client = Client()
    client.force_login(alice)
    page = client.get(reverse("render-job-detail", args=[job.pk])).content.decode()
    assert tail_shown(page).splitlines() == lines[-progress.TAIL_LINES :]
    assert "line 29 &lt;b&gt;" in page, "Blender's words are text, never markup"


def tail_shown(page: str) -> str:
    import html
    import re

    found = re.search(r'<pre data-field="log_tail"[^>]*>(.*?)</pre>', page, re.S)
    assert found, "the page has the log tail's region"
    return html.unescape(found.group(1))


def test_the_cost_so_far_keeps_the_rate_in_force_when_the_slice_was_first_held(
    alice: User,
    staff: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    """A price changed while a job renders reprices nothing: the page shows what the meter charges."""
    from billing.models import Market
    from billing.prices import PriceKey, add_price
    from tests.gpus.conftest import use_fleet

    seeds.ensure(Price)
    use_fleet(settings, "r: 1xH200:mig")
    job = a_job(alice, [1, 2])
    began = database_now() - timedelta(seconds=90)
    held = allocate(alice, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))
    holdings.ended(held.pk, began, began + timedelta(seconds=61))  # two started minutes
    rate = per_minute(SliceRequest("mig", "1g.18gb", "H200"), "on_demand")
    assert rate is not None

    add_price(PriceKey("H200-SXM5-141GB", "mig", "1g.18gb", Market.ON_DEMAND), "600", database_now(), by=staff)

    assert per_minute(SliceRequest("mig", "1g.18gb", "H200"), "on_demand") == Decimal(10), "the new price is in force"
    assert progress.cost_so_far(job) == 2 * rate


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "—"),
        (0.0, "0 s"),
        (0.04, "0.04 s"),
        (0.3, "0.3 s"),
        (0.449, "0.45 s"),
        (9.994, "9.99 s"),
        (12.4, "12 s"),
        (125.0, "2 min 5 s"),
        (7322.0, "2 h 2 min"),
    ],
)
def test_times_under_ten_seconds_show_to_the_hundredth_so_a_third_of_a_second_is_never_0_s(
    seconds: float | None, shown: str
) -> None:
    assert progress.duration(seconds) == shown
