# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""Each GPU host's render queue (issue 31), on the real render worker: it takes the queue of every host of its
machine, also of a host the portal learns of after its start (with simulated GPUs this machine stands in for
every host), and reads nothing of a host that is another machine's."""

from __future__ import annotations

import pytest

from portal.celery import app, render_queue
from sessions.gpus.models import GpuHost
from tests.render.stack import render_image, render_root, render_worker, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def queues_of(worker: str) -> set[str]:
    found = app.control.inspect(destination=[worker], timeout=1).active_queues() or {}
    return {queue["name"] for queue in found.get(worker, [])}


def test_the_render_worker_takes_the_queue_of_a_simulated_host_that_appears_after_its_start(
    render_worker: str,
) -> None:
    assert render_queue() in queues_of(render_worker)
    GpuHost.objects.create(name="late-host", backend=GpuHost.Backend.SIMULATED)
    GpuHost.objects.create(name="real-host", backend=GpuHost.Backend.NVML)  # another machine's, with a driver
    wait_for(lambda: render_queue("late-host") in queues_of(render_worker), 30, "the new host's render queue")
    assert render_queue("real-host") not in queues_of(render_worker)
