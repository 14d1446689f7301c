"""/metrics: a real fleet frame in Redis and real sessions and slices in, Prometheus text out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sessions.gpus.allocator import SliceRequest, allocate, release
from sessions.gpus.backends import get_backend
from sessions.gpus.backends.base import DeviceSample, GpuSample
from sessions.gpus.holders import Holder
from sessions.metrics.agent import LATEST_TTL_S, latest_key
from sessions.metrics.frames import dumps, fleet_frame
from sessions.notebooks.models import NotebookImage, NotebookSession
from tests.gpus.conftest import use_fleet

pytestmark = pytest.mark.django_db
TOKEN = "s3cret-scrape-token"
H200 = "H200-SXM5-141GB"
MIG_GPU = GpuSample(
    uuid="GPU-11111111-aaaa",
    index=0,
    model_name=H200,
    utilization=None,
    memory_used_mib=5000.0,
    memory_total_mib=144384.0,
    temperature_c=41.5,
    power_w=180.25,
    sm_clock_mhz=1980.0,
    memory_clock_mhz=3201.0,
    ecc_errors=0,
    processes=2,
    devices=(
        DeviceSample(
            "MIG-22222222-bbbb",
            gi_id=7,
            profile="1g.18gb",
            memory_used_mib=900.0,
            memory_total_mib=18432.0,
            utilization=None,
        ),
        DeviceSample(
            "MIG-33333333-cccc",
            gi_id=2,
            profile="3g.71gb",
            memory_used_mib=4000.0,
            memory_total_mib=72704.0,
            utilization=55.0,
        ),
    ),
)
WHOLE_GPU = GpuSample(
    uuid="GPU-44444444-dddd",
    index=1,
    model_name="L4",
    utilization=73.0,
    memory_used_mib=10000.0,
    memory_total_mib=23034.0,
    temperature_c=60.0,
    power_w=None,
    sm_clock_mhz=2040.0,
    memory_clock_mhz=6251.0,
    ecc_errors=None,
    processes=1,
)
MIG_LABELS = {"gpu": "0", "UUID": MIG_GPU.uuid, "device": "nvidia0", "modelName": H200, "Hostname": "gpu-a"}
WHOLE_LABELS = {"gpu": "1", "UUID": WHOLE_GPU.uuid, "device": "nvidia1", "modelName": "L4", "Hostname": "agent-1"}


@pytest.fixture
def token(settings) -> str:  # type: ignore[no-untyped-def]
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


@pytest.fixture
def frames(store: redis.Redis) -> float:
    """A fresh frame from agent-1 (one MIG GPU on host gpu-a, one whole GPU) and a stale one from agent-2."""
    now = time.time()
    fresh = fleet_frame("agent-1", now - 3, [MIG_GPU, WHOLE_GPU], {}, {MIG_GPU.uuid: "gpu-a"}, simulated=True)
    stale_gpu = GpuSample("GPU-55555555-eeee", 0, "L4", 10.0, 1.0, 2.0, 30.0, 70.0, 1.0, 1.0, 0, 0)
    stale = fleet_frame("agent-2", now - 600, [stale_gpu], {}, {}, simulated=True)
    store.hset(latest_key(), mapping={"agent-1": dumps(fresh), "agent-2": dumps(stale)})
    store.expire(latest_key(), LATEST_TTL_S)
    return now


@pytest.fixture
def portal_state(settings, alice: User, bob: User) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """Three held slices (two 1g.18gb, one whole L4), one released; sessions ready after 4 s, 45 s and 200 s."""
    settings.MAX_SLICES_PER_USER = 10
    use_fleet(settings, "m1: 1xH200:mig, 1xL4:whole")
    allocate(alice, SliceRequest("mig", "1g.18gb"), holder=Holder.notebook(1))
    allocate(bob, SliceRequest("mig", "1g.18gb"))
    allocate(alice, SliceRequest("whole", model="L4-24GB"))
    release(allocate(bob, SliceRequest("mig", "2g.35gb")).pk)
    image = NotebookImage.objects.create(name="Lab", image="gpu-portal/notebook:latest", default=True)
    t0 = timezone.now() - timedelta(hours=1)
    for name, state, ready_after in [
        ("a", "running", 4),
        ("b", "running", 45),
        ("c", "stopped", 200),
        ("d", "failed", None),
    ]:
        ready = t0 + timedelta(seconds=ready_after) if ready_after is not None else None
        NotebookSession.objects.create(
            owner=alice, server_name=name, image=image, state=state, requested_at=t0, ready_at=ready
        )
    NotebookSession.objects.create(owner=bob, server_name="e", image=image, state="starting", requested_at=t0)
    yield
    get_backend.cache_clear()


def scrape(client: Client, auth: str | None = f"Bearer {TOKEN}") -> list[Sample]:
    headers = {"Authorization": auth} if auth is not None else {}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return [s for family in text_string_to_metric_families(response.content.decode()) for s in family.samples]


def values(samples: list[Sample], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in samples if s.name == name}


def key(labels: dict[str, str], **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**labels, **more}.items()))


def test_gpu_figures_carry_dcgm_exporter_names_and_labels(client: Client, token: str, frames: float) -> None:
    samples = scrape(client)
    mig_small = key(MIG_LABELS, GPU_I_ID="7", GPU_I_PROFILE="1g.18gb")
    mig_big = key(MIG_LABELS, GPU_I_ID="2", GPU_I_PROFILE="3g.71gb")
    assert values(samples, "DCGM_FI_DEV_FB_USED") == {
        key(MIG_LABELS): 5000.0,
        mig_small: 900.0,
        mig_big: 4000.0,
        key(WHOLE_LABELS): 10000.0,
    }
    assert values(samples, "DCGM_FI_DEV_FB_FREE") == {
        key(MIG_LABELS): 139384.0,
        mig_small: 17532.0,
        mig_big: 68704.0,
        key(WHOLE_LABELS): 13034.0,
    }
    assert values(samples, "DCGM_FI_DEV_GPU_TEMP") == {key(MIG_LABELS): 41.5, key(WHOLE_LABELS): 60.0}
    assert values(samples, "DCGM_FI_DEV_POWER_USAGE") == {key(MIG_LABELS): 180.25}  # the L4 reported none
    assert values(samples, "DCGM_FI_DEV_SM_CLOCK") == {key(MIG_LABELS): 1980.0, key(WHOLE_LABELS): 2040.0}
    assert values(samples, "DCGM_FI_DEV_MEM_CLOCK") == {key(MIG_LABELS): 3201.0, key(WHOLE_LABELS): 6251.0}


def test_a_null_utilization_gets_no_sample_rather_than_zero(client: Client, token: str, frames: float) -> None:
    utilization = values(scrape(client), "DCGM_FI_DEV_GPU_UTIL")
    assert utilization == {
        key(MIG_LABELS, GPU_I_ID="2", GPU_I_PROFILE="3g.71gb"): 55.0,
        key(WHOLE_LABELS): 73.0,
    }  # neither the MIG-mode GPU itself nor its 1g.18gb device reported one


def test_only_fresh_agents_count_and_every_frame_shows_its_age(client: Client, token: str, frames: float) -> None:
    samples = scrape(client)
    assert values(samples, "portal_gpu_agents") == {(): 1.0}
    ages = {labels[0][1]: age for labels, age in values(samples, "portal_metrics_frame_age_seconds").items()}
    assert set(ages) == {"agent-1", "agent-2"}
    assert 3 <= ages["agent-1"] < 60 and 600 <= ages["agent-2"] < 660
    assert not any(s.labels.get("UUID") == "GPU-55555555-eeee" for s in samples)  # the stale agent's GPU


def test_portal_figures_come_from_the_database(client: Client, token: str, portal_state: None) -> None:
    samples = scrape(client)
    sessions = {labels[0][1]: n for labels, n in values(samples, "portal_sessions").items()}
    assert sessions == {state: 0.0 for state in NotebookSession.State.values} | {
        "running": 2.0,
        "stopped": 1.0,
        "failed": 1.0,
        "starting": 1.0,
    }
    assert values(samples, "portal_slices_in_use") == {
        (("kind", "mig"), ("profile", "1g.18gb")): 2.0,
        (("kind", "whole"), ("profile", "")): 1.0,
    }
    buckets = {dict(labels)["le"]: n for labels, n in values(samples, "portal_spawn_duration_seconds_bucket").items()}
    assert buckets == {
        "1.0": 0.0, "2.0": 0.0, "5.0": 1.0, "10.0": 1.0, "20.0": 1.0, "30.0": 1.0,
        "60.0": 2.0, "120.0": 2.0, "180.0": 2.0, "300.0": 3.0, "+Inf": 3.0,
    }  # fmt: skip
    assert values(samples, "portal_spawn_duration_seconds_count") == {(): 3.0}
    assert values(samples, "portal_spawn_duration_seconds_sum") == {(): 249.0}


def test_with_no_agent_there_are_just_no_gpu_rows(client: Client, token: str, store: redis.Redis) -> None:
    samples = scrape(client)
    assert not any(s.name.startswith("DCGM_") for s in samples)
    assert values(samples, "portal_gpu_agents") == {(): 0.0}
    assert values(samples, "portal_metrics_frame_age_seconds") == {}
    assert values(samples, "portal_spawn_duration_seconds_count") == {(): 0.0}


def test_metrics_are_off_without_a_token(client: Client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 404
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404


@pytest.mark.parametrize(
    "auth", [None, "Bearer wrong-token", f"Basic {TOKEN}", "Bearer ", f"Bearer {TOKEN}x", "Bearer t\u00f6ken"]
)
def test_a_missing_or_wrong_token_gets_401(client: Client, token: str, auth: str | None) -> None:
    headers = {"Authorization": auth} if auth is not None else {}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert b"DCGM" not in response.content and b"portal_" not in response.content


def test_only_get_is_answered(client: Client, token: str) -> None:
    response = client.post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 405
    assert response["Allow"] == "GET"
