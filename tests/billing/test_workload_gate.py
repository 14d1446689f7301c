"""One way to gate, stop and end any workload (issue 30, money 1): render jobs are gated and stopped at zero
credit like notebook sessions. The gate is asked at every allocation (probes, a job's further slices, retries,
whatever reconciliation dispatches) and at every commitment to a cost (a job's whole estimate, frames queued
again); the zero-balance stop stops every kind of workload."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User

from billing import credit, ledger, meter
from billing.models import CreditStop
from portal.clock import database_now
from sessions.gpus import holdings, workloads
from sessions.gpus.allocator import AllocationRefused, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.render import estimates, services
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from tests.billing.conftest import A100, Hold
from tests.factories import one_frame_a_chunk, running_session

pytestmark = pytest.mark.django_db
WHOLE = {"gpu_kind": "whole", "gpu_profile": "", "gpu_model": "A100-SXM4-80GB"}


def a_job(owner: User, state: str, frames: int = 500, max_slices: int = 4, estimate_s: float = 600) -> RenderJob:
    """A job of ``frames`` frames, one a chunk, on whole A100s, with an estimate of ``estimate_s`` a frame."""
    job = one_frame_a_chunk(owner, state, frames, max_slices, queued=state != RenderJob.State.AWAITING_CONFIRMATION)
    job.folder_path().mkdir(parents=True)
    planned = estimates.plan(frames, job.chunk_size, max_slices, estimate_s, 0)
    estimate = services.Estimate(
        facts={}, device="CPU", probe_samples=4, seconds_per_frame=estimate_s, overhead_s=0, frames=frames,
        chunks=planned.chunks, slices=planned.slices, total_seconds=planned.total_seconds, cost="",
        minutes=planned.minutes,
    )  # fmt: skip
    (job.folder_path() / services.ESTIMATE_FILE).write_text(json.dumps(asdict(estimate)))
    return job


def test_a_job_whose_whole_estimate_the_balance_does_not_cover_is_not_confirmed(
    fleet: object, quiet_render_queue: str, alice: User, staff: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """The issue's sequence: an estimate of 84.87 confirmed at a balance of 0.56, because the form checked ten
    minutes of one slice. The whole estimate, every slice it may hold, is what its owner commits to."""
    settings.BILLING_MIN_MINUTES = 10
    ledger.grant_credit(alice, "3.00", by=staff, reason="trial")  # covers ten minutes of one A100 (1.42)
    job = a_job(alice, RenderJob.State.AWAITING_CONFIRMATION, frames=500, max_slices=4)
    cost = services.commitment(job, 500)
    assert cost is not None and cost > 100
    with pytest.raises(services.Refused, match="this render job's estimate comes to"):
        services.confirm(job.pk, by=alice)
    assert RenderJob.objects.get(pk=job.pk).state == RenderJob.State.AWAITING_CONFIRMATION
    ledger.grant_credit(alice, str(cost.quantize(Decimal("0.01"))), by=staff, reason="the whole job")
    assert services.confirm(job.pk, by=alice).state == RenderJob.State.QUEUED


def test_at_zero_a_failed_job_s_frames_cannot_be_queued_again(
    fleet: object, quiet_render_queue: str, alice: User, hold: Hold, settings
) -> None:  # type: ignore[no-untyped-def]
    """'Requeue it at zero and it runs again': the frames left come to money the balance does not cover."""
    job = a_job(alice, RenderJob.State.FAILED, frames=20, estimate_s=60)
    RenderFrame.objects.filter(job=job, number__lte=5).update(state=RenderFrame.State.DONE)
    hold(alice, timedelta(minutes=30))
    meter.tick()
    assert ledger.balance(alice) < 0
    settings.BILLING_MIN_MINUTES = 10
    with pytest.raises(services.Refused, match="rendering its 15 frames that are not done"):
        services.requeue_failed(job.pk)
    assert RenderJob.objects.get(pk=job.pk).state == RenderJob.State.FAILED


def test_no_slice_goes_to_any_workload_of_someone_whose_credit_ran_out(
    fleet: object, quiet_render_queue: str, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    """A probe, a job's further slices, a retry, reconciliation's dispatch: all allocate through the gate."""
    settings.BILLING_MIN_MINUTES = 10
    CreditStop.objects.create(user=alice, stop_at=database_now() + timedelta(minutes=5))
    job = a_job(alice, RenderJob.State.QUEUED, frames=3)
    with pytest.raises(AllocationRefused) as refused:
        allocate(alice, job.request, holder=Holder.render(job.pk))
    assert refused.value.code == "credit" and "credit has run out" in refused.value.reason
    assert services.dispatch(job.pk) == 0 and services.held_by(job.pk) == []
    assert services.another_slice(job) is None
    assert allocate(alice, A100).pk  # a slice for no workload (fleet tooling, benchmarks) is not billed


def test_a_render_job_is_stopped_at_the_zero_balance_stop_like_a_session_and_charged_to_its_end(
    fleet: object, quiet_render_queue: str, alice: User, hold: Hold, django_capture_on_commit_callbacks: Any
) -> None:
    """The issue's sequence: the balance reached zero, 'sessions are being stopped' was pushed, and the job
    rendered to the end, the balance as negative as it likes."""
    image, _ = NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "gpu-portal/notebook:latest"})
    session = running_session(alice, image, A100, "lab")
    job = a_job(alice, RenderJob.State.RENDERING, frames=3)
    rendering = allocate(alice, job.request, holder=Holder.render(job.pk))
    began = database_now() - timedelta(minutes=6)
    holdings.started(rendering.pk, began)
    holdings.seen([rendering.pk], at=began + timedelta(minutes=5, seconds=30))
    RenderChunk.objects.filter(job=job, index=0).update(state=RenderChunk.State.RENDERING, slice=rendering)
    meter.tick()
    assert ledger.balance(alice) < 0

    now = database_now()
    assert credit.check_balances(now)["warned"] == 1
    with django_capture_on_commit_callbacks(execute=True):  # what happens once the stop commits
        assert credit.check_balances(now + timedelta(minutes=10))["stopped"] == 2  # both kinds, by the registry
    job.refresh_from_db()
    assert job.state == RenderJob.State.FAILED and "credit ran out" in job.failure_message
    assert NotebookSession.objects.get(pk=session.pk).state == NotebookSession.State.STOPPING
    rendering.refresh_from_db()
    assert rendering.released_at is not None
    assert rendering.held_until == began + timedelta(minutes=5, seconds=30)  # no container: its last proof
    assert workloads.live(alice.pk) == []  # the session is on its way out (stopping), the job failed
    meter.tick()
    assert Slice.objects.get(pk=rendering.pk).usage.billed_minutes == 6  # type: ignore[attr-defined]
