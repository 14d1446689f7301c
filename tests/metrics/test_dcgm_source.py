"""The dcgm-exporter metrics source (issue 34): the agent's samples read from the exporter's Prometheus text, over
HTTP from a stand-in that serves the real format (tests/metrics/dcgm_standin.py), rendered from the simulated
backend's own samples. It passes the sampling contract the NVML and simulated backends pass, gives the same
figures the backend gave the exporter, never takes the exporter's 0 for a MIG device's utilisation, finds a MIG
instance made since it last looked, and says why when the exporter does not answer."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from django.db import connection

from sessions.gpus import agency, catalog
from sessions.gpus.backends.base import GpuSample
from sessions.gpus.backends.simulated import SimulatedBackend
from sessions.metrics.agent import latest_frames
from sessions.metrics.dcgm import DcgmSource
from tests.conftest import ARTIFACTS
from tests.gpus import test_backend_contract as contract
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.metrics.dcgm_standin import Exporter

FLEET = "dcgm: 2xH200:mig, 1xA100-40GB:mig, 1xA30:shared=4, 1xL4:whole"


@pytest.fixture
def simulated(transactional_db: None) -> SimulatedBackend:
    return SimulatedBackend(FLEET)


@pytest.fixture
def exporter(simulated: SimulatedBackend) -> Iterator[Exporter]:
    """The stand-in, scraping the simulated GPUs from its own thread (committed rows: a transactional test)."""

    def sample() -> list[GpuSample]:
        try:
            return simulated.sample({}, now=1_800_000_000.0)
        finally:
            connection.close()  # the server thread's own connection

    with Exporter(sample) as serving:
        yield serving


@pytest.fixture
def source(simulated: SimulatedBackend, exporter: Exporter) -> DcgmSource:
    return DcgmSource(simulated, exporter.url)


def test_it_passes_the_sampling_contract_of_the_backends(source: DcgmSource) -> None:
    contract.test_sampling_reads_every_discovered_gpu_and_its_mig_devices(source)  # type: ignore[arg-type]


def test_it_gives_the_figures_the_backend_gave_the_exporter(simulated: SimulatedBackend, source: DcgmSource) -> None:
    with agency.acting_for(["dcgm"]):
        h200 = next(uuid for uuid, spec in simulated.gpus.items() if spec.model.name.startswith("H200"))
        profile = catalog.model("H200-SXM5-141GB").profile("1g.18gb")
        made = simulated.create_instance(h200, profile, simulated.possible_starts(h200, profile)[0])
    truth = {gpu.uuid: gpu for gpu in simulated.sample({}, now=1_800_000_000.0)}
    read = {gpu.uuid: gpu for gpu in source.sample({})}
    assert set(read) == set(truth)
    for uuid, gpu in truth.items():
        got = read[uuid]
        assert (got.index, got.model_name, got.problem) == (gpu.index, gpu.model_name, "")
        for figure in ("memory_used_mib", "memory_total_mib", "temperature_c", "power_w", "sm_clock_mhz"):
            assert getattr(got, figure) == pytest.approx(getattr(gpu, figure), abs=0.01), (uuid, figure)
        # A GPU in MIG mode has no whole-GPU utilisation: the exporter's 0 there is not taken.
        assert got.utilization == (None if gpu.utilization is None else pytest.approx(gpu.utilization, abs=0.01))
    (device,) = read[h200].devices
    truth_device = truth[h200].devices[0]
    assert (device.uuid, device.gi_id, device.profile) == (made.device_uuid, made.gi_id, "1g.18gb")
    assert device.memory_used_mib == pytest.approx(truth_device.memory_used_mib, abs=0.01)
    assert device.utilization == truth_device.utilization  # Hopper's GPM figure through the profiling ratio


def test_an_exporter_that_does_not_answer_leaves_every_gpu_unread_saying_why(
    exporter: Exporter, source: DcgmSource
) -> None:
    exporter.down = True
    samples = source.sample({})
    assert samples and all(gpu.problem.startswith(f"dcgm-exporter at {exporter.url} did not answer") for gpu in samples)
    assert all(gpu.utilization is None and gpu.memory_used_mib is None for gpu in samples)
    exporter.down = False
    assert not any(gpu.problem for gpu in source.sample({}))


def test_everything_but_sampling_is_the_backends(simulated: SimulatedBackend, source: DcgmSource) -> None:
    assert source.name == "simulated"
    assert [host.name for host in source.discover()] == [host.name for host in simulated.discover()]


def test_the_agent_publishes_what_the_exporter_measures_and_metrics_follow(
    simulated: SimulatedBackend,
    settings,
    client,  # type: ignore[no-untyped-def]
) -> None:
    """The agent process with PORTAL_METRICS_SOURCE=dcgm: its frames (and so the pages, history and /metrics)
    carry the exporter's figures, told apart here by a temperature only the stand-in gives."""
    use_fleet(settings, FLEET)

    def measured() -> list[GpuSample]:
        try:
            return [replace(gpu, temperature_c=42.5) for gpu in simulated.sample({})]
        finally:
            connection.close()

    with Exporter(measured) as exporter:
        log = ARTIFACTS / "logs" / "gpu-agent-dcgm.log"
        agent = processes.start_gpu_agent(
            FLEET, log, PORTAL_METRICS_SOURCE="dcgm", PORTAL_DCGM_EXPORTER_URL=exporter.url
        )
        try:
            deadline, temperatures = time.monotonic() + 60, []
            while time.monotonic() < deadline:
                frames = [json.loads(text) for text in latest_frames().values()]
                ours = [gpu for frame in frames for gpu in frame.get("gpus", []) if gpu["uuid"] in simulated.gpus]
                temperatures = [gpu.get("temp") for gpu in ours]
                if len(temperatures) == 5 and set(temperatures) == {42.5}:
                    break
                time.sleep(0.2)
            assert len(temperatures) == 5 and set(temperatures) == {42.5}, (temperatures, log.read_text()[-2000:])
        finally:
            processes.stop(agent)
    settings.METRICS_TOKEN = "dcgm-test-token"
    scraped = client.get("/metrics", headers={"Authorization": "Bearer dcgm-test-token"}).content.decode()
    rows = [
        line
        for line in scraped.splitlines()
        if line.startswith("DCGM_FI_DEV_GPU_TEMP{") and any(uuid in line for uuid in simulated.gpus)
    ]
    assert len(rows) == 5 and all(row.endswith(" 42.5") for row in rows), rows
