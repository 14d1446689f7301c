# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""A job cancelled while its probe renders, on the real stack (the Celery render worker, Docker, Blender):
the probe's container stops, its slice is released with the holding ended at the container's end, those
minutes are billed once, and the job's files are removed, as a cancel before the estimate removes them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing import meter
from billing.models import ChargedMinute, Usage
from sessions.render import services
from sessions.render.models import RenderJob
from tests.billing.conftest import ledger_total, unbalanced_transactions
from tests.render.stack import (  # noqa: F401 (fixtures)
    containers_of,
    estimate_worker,
    make_job,
    render_image,
    render_root,
    render_stack,
    render_worker,
    running_tasks,
    scenes,
    slices_of,
    state_of,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State


def probe_running(job: RenderJob) -> bool:
    return bool(containers_of(job)) and any(held.held_from for held in slices_of(job))


def test_cancelling_while_the_probe_renders_stops_it_bills_its_minutes_once_and_removes_the_files(
    render_stack: Path, render_worker: str, scenes: Path, alice: User, alice_client: Client
) -> None:
    job = make_job(alice, scenes / "big.blend", [1], State.VALIDATED)
    services.request_estimate(job.pk)
    wait_for(lambda: probe_running(job), 120, "the probe's container running on its slice")
    assert state_of(job) == State.ESTIMATING and job.scene_path().is_dir()

    answer = alice_client.post(reverse("render-job-cancel", args=[job.pk]))
    cancelled = timezone.now()

    assert answer.status_code == 302 and answer["Location"] == reverse("render-job-list")
    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.finished_at is not None
    [held] = slices_of(job)
    assert held.released_at is not None and held.released_at <= cancelled
    assert held.held_from is not None and held.held_until is not None
    assert held.held_from <= held.held_until <= cancelled, "charged up to the container's end, not the probe's"
    assert not job.folder_path().exists(), "the scene went with the cancel"
    wait_for(lambda: not containers_of(job), 30, "the probe's container removed")
    wait_for(lambda: not running_tasks(estimate_worker()), 60, "the probe's task to end")

    job.refresh_from_db()
    assert job.state == State.CANCELLED and services.estimate_of(job) is None
    assert not job.folder_path().exists(), "the probe's task wrote nothing back"
    [again] = slices_of(job)
    assert again.held_until == held.held_until, "the first end recorded stands"
    meter.charge_holding(held.pk)
    meter.charge_holding(held.pk)
    [usage] = Usage.objects.filter(slice=held)
    minutes = math.ceil((held.held_until - held.held_from).total_seconds() / 60)
    assert not usage.open and ChargedMinute.objects.filter(usage=usage).count() == minutes
    assert ledger_total() == 0 and unbalanced_transactions() == []
