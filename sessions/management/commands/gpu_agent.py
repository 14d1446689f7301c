"""Run the GPU agent of this host: the one process that changes its GPUs (it carries out the orders others
record, and discovers them every few minutes); it also samples every GPU each tick, publishes live frames,
keeps history and beats for the host."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from sessions.gpus import agency, orders
from sessions.gpus.backends import get_backend
from sessions.gpus.fleet import sync_fleet
from sessions.gpus.models import Gpu
from sessions.metrics.agent import Activity, Agent

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Sample this host's GPUs (or the simulated fleet) every tick and publish them (one agent per host)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval-ms", type=int, default=None, help="tick length (PORTAL_METRICS_INTERVAL_MS)")
        parser.add_argument("--ticks", type=int, default=None, help="stop after this many ticks (tests)")
        parser.add_argument("--no-docker", action="store_true", help="do not follow container CPU use")

    def handle(self, *args: Any, **options: Any) -> None:
        keep_connection_alive()
        backend = get_backend()
        interval_ms = options["interval_ms"] or settings.METRICS_INTERVAL_MS
        if interval_ms < 100:
            self.stderr.write("gpu_agent: --interval-ms must be at least 100")
            raise SystemExit(2)
        beats_for = agency.hosts_of_this_machine()
        name = settings.GPU_HOST_NAME if backend.name == "nvml" else "simulated"  # one stands in for them all
        agency.act_for(beats_for)  # this process alone changes these hosts' GPUs (sessions.gpus.orders)
        sync_fleet(backend)
        hosts = dict(Gpu.objects.filter(host__backend=backend.name).values_list("uuid", "host__name"))
        executor = orders.Executor(beats_for, discover=lambda: sync_fleet(backend))
        executor.discovered_at = time.monotonic()
        executor.start()
        activity = Activity(None if options["no_docker"] or backend.name != "simulated" else _docker_reader())
        gc.freeze()  # the long-lived objects made at start-up need never be scanned again
        sampled: Any = backend
        if settings.METRICS_SOURCE == "dcgm":  # the node's dcgm-exporter measures; the backend does the rest
            from sessions.metrics.dcgm import DcgmSource

            sampled = DcgmSource(backend, settings.DCGM_EXPORTER_URL)
        agent = Agent(sampled, name, interval_ms / 1000, activity=activity, hosts=hosts, beats_for=beats_for)
        try:
            asyncio.run(agent.run(options["ticks"]))
        except KeyboardInterrupt:
            log.info("gpu_agent: stopped")
        finally:
            executor.stop()


def keep_connection_alive() -> None:
    """One database connection for the agent's life, checked before reuse and replaced when it broke.

    The portal's default (a pooled connection per request) is for many threads at once; the agent is one.
    """
    from django.db import connections

    settings_dict = connections["default"].settings_dict
    settings_dict["OPTIONS"] = {key: value for key, value in settings_dict["OPTIONS"].items() if key != "pool"}
    settings_dict.update(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True)


def _docker_reader() -> Any:
    """Container CPU use by device, or None where no Docker engine answers (figures then rest idle)."""
    from sessions.runtime.docker import DockerRuntime

    try:
        runtime = DockerRuntime()
        runtime.client.ping()
    except Exception as error:  # RuntimeError_ or the ping failing: either way no engine
        log.info("gpu_agent: no Docker engine (%s); simulated GPUs will look idle", error)
        return None
    return runtime.cpu_by_device
