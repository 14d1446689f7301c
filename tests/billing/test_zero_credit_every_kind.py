# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""At zero credit, every kind of workload stops (issue 30, money 1), with the real parts: a notebook session
through the hub and the spawner, a render job rendering in its sandbox on the render worker. Both are warned
together, both are stopped at the grace's end through the workload registry, and both are charged to the
moments their containers were gone as the engine recorded them."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User

from billing import credit, ledger, meter
from billing.models import Usage
from portal.clock import database_now
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import Launch, start_session
from sessions.render import services
from sessions.render.models import RenderJob
from sessions.runtime.docker import DockerRuntime
from tests.billing.conftest import ledger_total, unbalanced_transactions
from tests.render.stack import (  # noqa: F401 (fixtures)
    containers_of,
    make_job,
    render_image,
    render_root,
    render_stack,
    render_worker,
    scenes,
    slices_of,
    wait_for,
)

pytestmark = [pytest.mark.hub, pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def died(runtime: DockerRuntime, label: str, since: datetime) -> datetime:
    """When the engine saw the last of the containers carrying this label die, from its event log."""
    events = runtime.client.events(
        since=f"{since.timestamp():.6f}",
        until=f"{datetime.now().timestamp():.6f}",
        decode=True,
        filters={"type": "container", "event": "die", "label": [label]},
    )
    moments = [datetime.fromtimestamp(int(event["timeNano"]) / 1e9).astimezone() for event in events]
    assert moments, f"the engine saw no container with {label} die"
    return max(moments)


def charged_to_its_end(held: Slice) -> None:
    wait_for(lambda: Usage.objects.filter(slice=held, open=False).exists(), 60, "the meter's charge of its end")
    usage = Usage.objects.get(slice=held)
    assert held.held_from is not None and held.held_until is not None
    assert usage.billed_minutes == max(1, math.ceil((held.held_until - held.held_from).total_seconds() / 60))


def test_at_zero_a_session_and_a_render_job_are_both_stopped_at_the_grace_s_end_and_charged_to_their_ends(
    render_stack: object, scenes: object, hub: str, portal_server: str, notebook_image: NotebookImage, alice: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:  # fmt: skip
    settings.BILLING_GRACE_MINUTES = 1
    began = database_now()
    session = start_session(alice, Launch(SliceRequest("mig", "1g.18gb"), notebook_image.pk, "broke"))
    job = make_job(alice, scenes / "slow.blend", list(range(1, 21)), RenderJob.State.AWAITING_CONFIRMATION,  # type: ignore[operator]
                   chunk_size=1, samples=256)  # fmt: skip
    services.confirm(job.pk, alice)
    wait_for(lambda: NotebookSession.objects.get(pk=session.pk).state == NotebookSession.State.RUNNING, 120,
             "the session running")  # fmt: skip
    wait_for(lambda: containers_of(job) and slices_of(job)[0].held_from, 180, "the job rendering in its container")

    meter.tick()  # each holding's first minute: the balance, never topped up, goes below zero
    assert ledger.balance(alice) < 0
    now = database_now()
    assert credit.check_balances(now)["warned"] == 1
    assert credit.check_balances(now + timedelta(seconds=59))["stopped"] == 0
    assert credit.check_balances(now + timedelta(minutes=1))["stopped"] == 2  # both kinds, through the registry

    wait_for(lambda: NotebookSession.objects.get(pk=session.pk).state == NotebookSession.State.STOPPED, 90,
             "the hub to stop the session")  # fmt: skip
    job.refresh_from_db()
    assert job.state == RenderJob.State.FAILED and "credit ran out" in job.failure_message
    wait_for(lambda: not containers_of(job), 60, "the job's containers gone")
    session.refresh_from_db()
    assert session.ended_reason == NotebookSession.EndReason.CREDIT

    runtime = DockerRuntime()
    assert session.slice_id is not None
    notebook = Slice.objects.get(pk=session.slice_id)
    [rendered] = slices_of(job)
    wait_for(lambda: Slice.objects.get(pk=rendered.pk).released_at, 30, "the job's slice released")
    rendered.refresh_from_db()
    assert notebook.held_until is not None and rendered.held_until is not None
    # The ends are the engine's moments, not the portal's.
    assert abs(notebook.held_until - died(runtime, f"gpu-portal.session={session.pk}", began)) < timedelta(
        milliseconds=250
    )
    assert abs(rendered.held_until - died(runtime, f"gpu-portal.render_job={job.pk}", began)) < timedelta(
        milliseconds=250
    )
    charged_to_its_end(notebook)
    charged_to_its_end(rendered)
    assert unbalanced_transactions() == [] and ledger_total() == 0
