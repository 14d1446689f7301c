# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""Estimates have a lane of their own: while one person's long job holds every thread of the render worker,
another person's upload is still estimated at once, on the real stack (the Celery workers as the
supervisor runs them, Docker, Blender)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User

from sessions.render import services, stopping
from sessions.render.models import RenderChunk, RenderJob
from tests.render.stack import (  # noqa: F401 (fixtures)
    RENDER_THREADS,
    containers_of,
    make_job,
    render_image,
    render_root,
    render_stack,
    render_worker,
    running_tasks,
    scenes,
    state_of,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State


def rendering_on_every_thread(job: RenderJob, worker: str) -> bool:
    """Each of the render worker's threads follows one of the job's slices, whose chunk's container runs."""
    tasks = [task for task in running_tasks(worker) if isinstance(task, dict)]
    busy = [task for task in tasks if task.get("name") == "sessions.render.tasks.work_on_slice"]
    chunks = RenderChunk.objects.filter(job=job, state=RenderChunk.State.RENDERING).count()
    return len(busy) == RENDER_THREADS == chunks and len(containers_of(job)) == RENDER_THREADS


def test_an_upload_is_estimated_while_another_persons_long_job_holds_every_render_thread(
    render_stack: Path, render_worker: str, scenes: Path, alice: User, bob: User
) -> None:
    # Bob's job renders frames that take hours, one chunk per slice, on as many slices as the worker has threads.
    confirmed = State.AWAITING_CONFIRMATION
    long_job = make_job(bob, scenes / "endless.blend", [1, 2, 3, 4], confirmed, chunk_size=1, max_slices=RENDER_THREADS)
    services.confirm(long_job.pk, bob)
    try:
        wait_for(lambda: rendering_on_every_thread(long_job, render_worker), 120, "bob's job on every render thread")
        upload = make_job(alice, scenes / "small.blend", [1, 2, 3], State.VALIDATED)

        services.request_estimate(upload.pk)

        wait_for(lambda: state_of(upload) != State.ESTIMATING, 120, "alice's estimate")
        assert state_of(upload) == State.AWAITING_CONFIRMATION, RenderJob.objects.get(pk=upload.pk).failure_message
        assert services.estimate_of(upload) is not None
        assert rendering_on_every_thread(long_job, render_worker), "bob's job held every render thread throughout"
    finally:
        stopping.cancel(long_job.pk)
    wait_for(lambda: not running_tasks(render_worker), 60, "the render worker idle again")
