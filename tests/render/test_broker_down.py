# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""An upload while the Celery broker does not answer, on the real stack: daphne's broker URL names a port on
127.0.0.1 where nothing listens. The upload is accepted and its page shows it being unpacked, never an error
page; the lost send is noticed by reconciliation, which sends it again, and the estimate arrives."""

from __future__ import annotations

import http.client
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from sessions.render import recovery, services
from sessions.render.models import RenderJob
from tests.helpers import processes
from tests.helpers.tus import HttpUploader, upload_over_http
from tests.helpers.websockets import session_cookie
from tests.render.stack import (  # noqa: F401 (fixtures)
    MIG_OFFER,
    daphne_on,
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
OFFER = "{gpu_kind}:{gpu_model}:{gpu_profile}".format(**MIG_OFFER)


def uploaded_over_http(base: str, user: User, scene: Path) -> http.client.HTTPResponse:
    """The scene in parts and the form that names it, as the page's script sends them, to a portal of its own."""
    data = scene.read_bytes()
    uploader = HttpUploader(int(base.rsplit(":", 1)[1]), session_cookie(user))
    token, sha256 = upload_over_http(uploader, scene.name, len(data), lambda at, size: data[at : at + size], 1 << 20)
    return uploader.form(token, sha256, frames="1", resolution_percent="100", chunk_size="1", offer=OFFER)


def test_an_upload_while_the_broker_is_down_is_accepted_and_its_estimate_arrives_once_it_is_sent_again(
    render_stack: Path, scenes: Path, alice: User
) -> None:
    nothing_there = f"redis://127.0.0.1:{processes.free_port()}/0"
    with daphne_on(render_stack, PORTAL_CELERY_BROKER_URL=nothing_there) as portal:
        answer = uploaded_over_http(portal, alice, scenes / "small.blend")
        job = RenderJob.objects.get(owner=alice)
        assert answer.status == 302, answer.status
        assert answer.headers["Location"] == reverse("render-job-detail", args=[job.pk])
        page = requests.get(portal + answer.headers["Location"], headers={"Cookie": session_cookie(alice)}, timeout=30)
        assert page.status_code == 200 and 'data-testid="unpacking"' in page.text

    job.refresh_from_db()
    assert job.state == State.UNPACKING and job.unpack_sent_at is None, "the send was lost, and it shows"
    assert slices_of(job) == []

    counts = recovery.reconcile()

    assert counts["unpacking_sent"] == 1
    wait_for(lambda: state_of(job) not in (State.UNPACKING, State.ESTIMATING), 180, "its unpacking, then its estimate")
    job.refresh_from_db()
    assert job.state == State.AWAITING_CONFIRMATION, job.failure_message
    assert services.estimate_of(job) is not None and job.estimate_sent_at is not None
    assert len(slices_of(job)) == 1, "one probe, however often its task was sent"
    assert recovery.reconcile()["unpacking_sent"] == 0


def test_reconciliation_takes_a_job_left_checked_to_its_probe_and_resends_a_long_silent_one_alone(
    render_stack: Path, render_worker: str, scenes: Path, alice: User
) -> None:
    """Left checked: its step to the probe was never taken (its process died between the two). Silent: its
    task was sent long ago and never ran. Recent: its task was heard of a minute ago (it waits for a slice,
    or in the queue), so nothing is sent for it."""
    now = timezone.now()
    checked = make_job(alice, scenes / "small.blend", [1], State.VALIDATED)
    RenderJob.objects.filter(pk=checked.pk).update(created_at=now - timedelta(minutes=5))
    scene = scenes / "small.blend"
    silent = make_job(alice, scene, [1], State.ESTIMATING, estimate_sent_at=now - timedelta(minutes=11))
    recent = make_job(alice, scene, [1], State.ESTIMATING, estimate_sent_at=now - timedelta(minutes=1))

    assert recovery.reconcile()["estimates_sent"] == 2

    estimated = (checked, silent)
    wait_for(lambda: all(state_of(job) == State.AWAITING_CONFIRMATION for job in estimated), 240, "both estimates")
    wait_for(lambda: not running_tasks(estimate_worker()), 60, "the estimate worker idle")
    assert state_of(recent) == State.ESTIMATING and slices_of(recent) == []
    assert recovery.reconcile()["estimates_sent"] == 0
