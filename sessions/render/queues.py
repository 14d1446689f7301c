"""Each GPU host's render queue (issue 31): a slice's worker goes to ``<render queue>@<host>``, which only the
render worker of that host's machine reads, so a chunk renders on the machine that holds its slice and a
worker's recovery after a restart touches only its own hosts' chunks. The render worker takes its hosts' queues
as it starts (``portal.celery``), and, with simulated GPUs, those of hosts the portal learns of later.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.signals import worker_ready
from django.conf import settings
from django.db import close_old_connections

from portal.celery import app, render_queue, send
from sessions.gpus import agency
from sessions.gpus.backends import get_backend
from sessions.gpus.models import GpuHost, Slice
from sessions.runtime import engines

log = logging.getLogger(__name__)
WORK_ON_SLICE = "sessions.render.tasks.work_on_slice"
RECOVER = "sessions.render.tasks.recover_render_work"
TAKE_EVERY_S = 2.0  # how soon a render worker takes the queue of a host that appeared after its start


def hosts_here() -> list[str]:
    """The hosts whose render queue this machine's render worker reads: PORTAL_RENDER_HOSTS where set; else its
    GPU agent's hosts and, with simulated GPUs, every simulated host the portal knows whose containers run on
    this machine's engine, since this one machine stands in for them all (a host with an engine of its own,
    PORTAL_DOCKER_ENGINES, has its own machine and render worker)."""
    if settings.RENDER_HOSTS:
        return sorted(set(settings.RENDER_HOSTS))
    hosts = set(agency.hosts_of_this_machine())
    if get_backend().name != "nvml":
        simulated = GpuHost.objects.filter(backend=GpuHost.Backend.SIMULATED).values_list("name", flat=True)
        hosts |= {host for host in simulated if engines.endpoint_of(host) == engines.LOCAL}
    return sorted(hosts)


def hosts_read() -> set[str] | None:
    """The hosts whose render queue some running worker reads now, in the workers' own answers (a broadcast that
    waits a second for them); None when no worker answers at all (the broker away: nothing to conclude)."""
    replies = app.control.inspect(timeout=1.0).active_queues()
    if not replies:
        return None
    prefix = f"{render_queue()}@"
    names = (queue.get("name", "") for queues in replies.values() for queue in queues or ())
    return {name.removeprefix(prefix) for name in names if name.startswith(prefix)}


def host_of(slice_id: int) -> str:
    return str(Slice.objects.filter(pk=slice_id).values_list("gpu__host__name", flat=True).get())


def send_worker(job_id: int, slice_id: int) -> None:
    """Send the slice's worker to the render queue of the slice's host (raising if the broker does not answer;
    reconciliation sends one again to a slice nobody works on)."""
    send(WORK_ON_SLICE, job_id, slice_id, queue=render_queue(host_of(slice_id)))


@worker_ready.connect
def take_host_queues(sender: Any = None, **kwargs: Any) -> None:
    """The render worker (the one that reads the render queue, or a GPU host's that reads only its host's), at
    start: a thread of its own takes the render queue of each host of this machine, each after sending that
    host's recovery (the chunks it was rendering there when it stopped are put back), then (with simulated
    GPUs) those of hosts the portal learns of later."""
    queues = {queue.name for queue in getattr(getattr(sender, "task_consumer", None), "queues", ())}
    if any(queue == render_queue() or queue.startswith(f"{render_queue()}@") for queue in queues):
        threading.Thread(target=_take, args=(sender.hostname,), name="render-hosts", daemon=True).start()


def _take(worker: str) -> None:
    recovered: set[str] = set()  # once per host and start: a second would put back chunks rendering by now
    taken: set[str] = set()
    while True:
        try:
            for host in sorted(set(hosts_here()) - taken):
                if host not in recovered:
                    app.send_task(RECOVER, args=[host], queue=render_queue(host))
                    recovered.add(host)
                if app.control.add_consumer(render_queue(host), destination=[worker], reply=True, timeout=5):
                    taken.add(host)
                    log.info("render worker %s takes the render queue of host %s", worker, host)
        except Exception:  # the database or the broker away for a moment: the next round tries again
            log.exception("render worker %s: the hosts' render queues were not all taken", worker)
        finally:
            close_old_connections()
        time.sleep(TAKE_EVERY_S)
