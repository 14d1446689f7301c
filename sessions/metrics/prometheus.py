"""``/metrics`` for Prometheus: the fleet's GPU figures as dcgm-exporter names them, and the portal's own.

GPU figures come from the latest fleet frame each agent leaves in Redis, so a
scrape never touches a GPU and dashboards built for dcgm-exporter work as they
are. A figure the device does not report (null in the frame) gets no sample at
all: dcgm-exporter writes 0 for MIG utilisation, which reads as an idle slice.
Portal figures (slices, hosts) come from the database; the workloads and other apps add theirs with
``add_collector`` (notebook sessions and spawn times, sessions/notebooks/prometheus.py; billing's counters:
sessions never import billing, and metrics never import a workload).

A fresh registry is built per request: nothing is kept between scrapes, and
several portal processes answer alike.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from portal.clock import database_now
from sessions.gpus.models import GpuHost, Slice
from sessions.metrics.agent import LATEST_TTL_S, latest_frames

log = logging.getLogger(__name__)
REDIS_TIMEOUT_S = 2.0

# Frame field -> (dcgm-exporter name, its help text). MIG devices report only util and memory.
GPU_FIGURES = {
    "util": ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    "mem_used": ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    "mem_free": ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    "temp": ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    "power": ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    "mem_clock": ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),
}

Frame = dict[str, Any]
_added: list[Any] = []  # collectors other apps registered at start-up (AppConfig.ready)


def add_collector(collector: Any) -> None:
    """Include ``collector`` (an object with ``collect()``) in every scrape; adding it twice is harmless."""
    if all(type(known) is not type(collector) for known in _added):
        _added.append(collector)


def read_frames() -> dict[str, Frame]:
    """Every agent's latest fleet frame. Redis away or a garbled frame means fewer GPU rows, not a failed
    scrape: the portal's own figures still matter then, and ``portal_gpu_agents`` shows the gap."""
    try:
        raw = latest_frames(REDIS_TIMEOUT_S)
    except redis.RedisError as error:
        log.warning("metrics: cannot read the agents' frames: %s", error)
        return {}
    frames = {}
    for agent, text in raw.items():
        try:
            frames[agent] = json.loads(text)
        except ValueError as error:
            log.warning("metrics: agent %r left a frame that is not JSON: %s", agent, error)
    return frames


def _free(row: Frame) -> float | None:
    """Free framebuffer memory, or None where either figure is missing (never a made-up total)."""
    used, total = row.get("mem_used"), row.get("mem_total")
    return None if used is None or total is None else max(0.0, float(total) - float(used))


def _gpu_labels(gpu: Frame) -> dict[str, str]:
    """dcgm-exporter's labels for a GPU; MIG rows add GPU_I_ID and GPU_I_PROFILE to these."""
    return {
        "gpu": str(gpu["index"]),
        "UUID": str(gpu["uuid"]),
        "device": f"nvidia{gpu['index']}",
        "modelName": str(gpu["model"]),
        "Hostname": str(gpu["host"]),
    }


def gpu_rows(frames: Iterable[Frame]) -> Iterator[tuple[dict[str, str], Frame]]:
    """Each GPU and each MIG device as (labels, figures); a MIG row keeps its parent's UUID as dcgm-exporter does."""
    for frame in frames:
        for gpu in frame.get("gpus", []):
            labels = _gpu_labels(gpu)
            yield labels, {**gpu, "mem_free": _free(gpu)}
            for device in gpu.get("devices", []):
                mig = {**labels, "GPU_I_ID": str(device["gi"]), "GPU_I_PROFILE": str(device["profile"])}
                yield mig, {"util": device.get("util"), "mem_used": device.get("mem_used"), "mem_free": _free(device)}


def gpu_families(frames: Iterable[Frame]) -> list[Metric]:
    """One family per dcgm field. GPU and MIG rows differ in labels, so samples go in directly."""
    families = {field: GaugeMetricFamily(name, text) for field, (name, text) in GPU_FIGURES.items()}
    for labels, figures in gpu_rows(frames):
        for field, family in families.items():
            value = figures.get(field)
            if value is not None:  # null means not reported: no sample, never 0
                family.samples.append(Sample(family.name, labels, float(value)))
    return [family for family in families.values() if family.samples]


def fresh(frames: dict[str, Frame], now: float) -> dict[str, Frame]:
    """Frames young enough to trust. The Redis hash lives on while any agent writes, so a stopped agent's
    field stays behind: its figures would be stale, and are left out."""
    return {agent: frame for agent, frame in frames.items() if now - float(frame.get("t", 0)) <= LATEST_TTL_S}


def agent_families(frames: dict[str, Frame], now: float) -> list[Metric]:
    agents = GaugeMetricFamily("portal_gpu_agents", "GPU agents whose latest fleet frame is fresh.")
    agents.add_metric([], len(fresh(frames, now)))
    age = GaugeMetricFamily(
        "portal_metrics_frame_age_seconds", "Seconds since each agent's latest fleet frame.", labels=["agent"]
    )
    for agent, frame in sorted(frames.items()):
        age.add_metric([agent], max(0.0, now - float(frame.get("t", 0))))
    return [agents, age]


def slices_family() -> Metric:
    family = GaugeMetricFamily("portal_slices_in_use", "GPU slices held now.", labels=["kind", "profile"])
    held = Slice.objects.filter(released_at__isnull=True).values_list("kind", "profile").annotate(n=Count("pk"))
    for kind, profile, n in held.order_by("kind", "profile"):
        family.add_metric([kind, profile], n)
    return family


def hosts_families() -> list[Metric]:
    """Each GPU host's state (one sample per state, 1 for the one it is in) and its heartbeat's age."""
    state = GaugeMetricFamily(
        "portal_gpu_host_state", "GPU hosts by state (1 for the state each is in).", labels=["host", "state"]
    )
    age = GaugeMetricFamily(
        "portal_gpu_host_heartbeat_age_seconds", "Seconds since each GPU host's agent last beat.", labels=["host"]
    )
    now = database_now()
    for name, current, beat in GpuHost.objects.values_list("name", "state", "heartbeat_at"):
        for value in GpuHost.State.values:
            state.add_metric([name, value], 1 if value == current else 0)
        if beat is not None:
            age.add_metric([name], max(0.0, (now - beat).total_seconds()))
    return [state, age]


class PortalCollector:
    """Everything /metrics shows, read afresh at each collect."""

    def collect(self) -> Iterable[Metric]:
        now = time.time()
        frames = read_frames()
        yield from gpu_families(fresh(frames, now).values())
        yield from agent_families(frames, now)
        yield slices_family()
        yield from hosts_families()


def _authorised(request: HttpRequest) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # As bytes: compare_digest refuses non-ASCII text, and a header may carry anything.
    offered, expected = given.strip().encode(errors="replace"), settings.METRICS_TOKEN.encode()
    return scheme == "Bearer" and bool(offered) and hmac.compare_digest(offered, expected)


@csrf_exempt  # machine-to-machine, authenticated by the bearer token; a POST gets 405, not a CSRF 403
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrapes here. Off (404) without a token configured, so no deployment exposes it by accident."""
    if not settings.METRICS_TOKEN:
        raise Http404("Metrics are off.")
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    if not _authorised(request):
        response = HttpResponse("A bearer token is needed.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PortalCollector())
    for collector in _added:
        registry.register(collector)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
