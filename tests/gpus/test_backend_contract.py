"""One contract for every GPU backend: the simulated one here, NVML where a driver answers.

The NVML run is marked ``gpu`` and is read-only unless PORTAL_GPU_TESTS_MAY_CHANGE=1:
it discovers and reads placements, and never creates instances or touches MIG mode.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sessions.gpus import catalog
from sessions.gpus.backends.base import BackendError, GpuBackend
from sessions.gpus.backends.nvml import NvmlBackend, nvml_available
from sessions.gpus.backends.simulated import SimulatedBackend

MAY_CHANGE_REAL_GPUS = os.environ.get("PORTAL_GPU_TESTS_MAY_CHANGE") == "1"


@pytest.fixture(params=["simulated", pytest.param("nvml", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest, db: None) -> Iterator[GpuBackend]:
    if request.param == "nvml":
        if not nvml_available():
            pytest.skip("no NVIDIA driver answers on this host")
        yield NvmlBackend("contract-host")
    else:
        yield SimulatedBackend("contract: 2xH200:mig, 1xA100-40GB:mig, 1xA30:shared=4, 1xL4:whole")


def mig_gpus(backend: GpuBackend) -> list[tuple[str, catalog.GpuModel]]:
    found = []
    for host in backend.discover():
        for gpu in host.gpus:
            if gpu.mig_enabled and not gpu.problem:
                found.append((gpu.uuid, catalog.model(gpu.model_name)))
    return found


def test_discovery_reports_each_gpu_with_a_uuid_and_memory(backend: GpuBackend) -> None:
    hosts = backend.discover()
    assert hosts and all(host.name and host.driver_version for host in hosts)
    gpus = [gpu for host in hosts for gpu in host.gpus]
    assert gpus
    for gpu in gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.memory_mib > 1024
        assert gpu.mig_capable or not gpu.mig_enabled
        for instance in gpu.instances:
            assert instance.device_uuid.startswith("MIG-")


def test_discovery_is_stable_between_calls(backend: GpuBackend) -> None:
    first = [(g.uuid, g.model_name, g.mig_enabled) for h in backend.discover() for g in h.gpus]
    second = [(g.uuid, g.model_name, g.mig_enabled) for h in backend.discover() for g in h.gpus]
    assert first == second


def test_possible_starts_are_a_subset_of_the_catalogs_placements(backend: GpuBackend) -> None:
    for gpu_uuid, model in mig_gpus(backend):
        for profile in model.profiles:
            assert set(backend.possible_starts(gpu_uuid, profile)) <= set(profile.placements)


def test_an_instance_can_be_created_found_and_destroyed(backend: GpuBackend) -> None:
    if isinstance(backend, NvmlBackend) and not MAY_CHANGE_REAL_GPUS:
        pytest.skip("creating MIG instances changes the GPU; set PORTAL_GPU_TESTS_MAY_CHANGE=1 to allow it")
    gpus = mig_gpus(backend)
    if not gpus:
        pytest.skip("no GPU with MIG mode on")
    gpu_uuid, model = gpus[0]
    profile = min(model.profiles, key=lambda p: (p.compute_slices, p.memory_slices, p.media_extensions))
    starts = backend.possible_starts(gpu_uuid, profile)
    if not starts:
        pytest.skip("no free placement for the smallest profile")
    made = backend.create_instance(gpu_uuid, profile, starts[-1])
    try:
        assert made.device_uuid.startswith("MIG-")
        assert (made.profile, made.start, made.size) == (profile.name, starts[-1], profile.placement_size)
        listed = [i for h in backend.discover() for g in h.gpus if g.uuid == gpu_uuid for i in g.instances]
        assert made.device_uuid in {i.device_uuid for i in listed}
        assert starts[-1] not in backend.possible_starts(gpu_uuid, profile)
    finally:
        backend.destroy_instance(gpu_uuid, made.gi_id)
    listed = [i for h in backend.discover() for g in h.gpus if g.uuid == gpu_uuid for i in g.instances]
    assert made.device_uuid not in {i.device_uuid for i in listed}


def test_an_illegal_placement_is_refused_with_a_reason(backend: GpuBackend) -> None:
    if isinstance(backend, NvmlBackend) and not MAY_CHANGE_REAL_GPUS:
        pytest.skip("a create attempt on a real GPU is not read-only")
    gpus = mig_gpus(backend)
    if not gpus:
        pytest.skip("no GPU with MIG mode on")
    gpu_uuid, model = gpus[0]
    biggest = max(model.profiles, key=lambda p: p.compute_slices)
    with pytest.raises(BackendError) as refused:
        backend.create_instance(gpu_uuid, biggest, 1)
    assert refused.value.code in {"insufficient_resources", "not_supported", "driver"}
    assert str(refused.value)


def test_destroying_a_missing_instance_is_a_clear_error(backend: GpuBackend) -> None:
    if isinstance(backend, NvmlBackend) and not MAY_CHANGE_REAL_GPUS:
        pytest.skip("destroy calls on a real GPU are not read-only")
    gpus = mig_gpus(backend)
    if not gpus:
        pytest.skip("no GPU with MIG mode on")
    with pytest.raises(BackendError) as refused:
        backend.destroy_instance(gpus[0][0], 14)
    assert refused.value.code in {"not_found", "driver"}


def test_sampling_reads_every_discovered_gpu_and_its_mig_devices(backend: GpuBackend) -> None:
    """Read-only on real GPUs: what the agent does every second."""
    import time

    discovered = {gpu.uuid: gpu for host in backend.discover() for gpu in host.gpus if not gpu.problem}
    samples = {sample.uuid: sample for sample in backend.sample({})}
    time.sleep(1.1)
    again = {sample.uuid: sample for sample in backend.sample({})}  # a second read: GPM needs two samples
    assert set(discovered) <= set(samples) and set(samples) == set(again)
    for uuid, gpu in discovered.items():
        sample = again[uuid]
        assert not sample.problem
        assert sample.memory_total_mib is not None and abs(sample.memory_total_mib - gpu.memory_mib) <= 1024
        assert sample.memory_used_mib is not None and 0 <= sample.memory_used_mib <= sample.memory_total_mib
        assert sample.temperature_c is None or 0 < sample.temperature_c < 120
        assert sample.power_w is None or 0 < sample.power_w < 2000
        assert sample.utilization is None or 0 <= sample.utilization <= 100
        assert sample.sm_clock_mhz is None or 0 <= sample.sm_clock_mhz < 5000
        if gpu.mig_enabled:
            assert sample.utilization is None, "no whole-GPU utilisation under MIG: unavailable, never 0"
            assert {d.uuid for d in sample.devices} == {i.device_uuid for i in gpu.instances}
            for device in sample.devices:
                assert 0 <= device.memory_used_mib <= device.memory_total_mib
                assert device.utilization is None or 0 <= device.utilization <= 100
        print(f"sampled {gpu.product_name}: {sample}")  # what the NVML run saw, for the note


def test_the_simulated_driver_refuses_what_the_catalog_refuses_and_hands_out_the_lowest_free_id(db: None) -> None:
    """Its create is one statement checking overlap, the compute budget and the profile's count limit."""
    backend = SimulatedBackend("rules: 1xH200:mig")
    [(gpu_uuid, model)] = mig_gpus(backend)
    three, two, one = model.profile("3g.71gb"), model.profile("2g.35gb"), model.profile("1g.18gb")
    first = backend.create_instance(gpu_uuid, three, 0)
    with pytest.raises(BackendError, match="some are taken") as overlap:
        backend.create_instance(gpu_uuid, two, 2)  # memory slices 2-3 belong to the 3g
    assert overlap.value.code == "insufficient_resources"
    second = backend.create_instance(gpu_uuid, two, 4)
    third = backend.create_instance(gpu_uuid, one, 6)
    assert [first.gi_id, second.gi_id, third.gi_id] == [1, 2, 3]
    backend.destroy_instance(gpu_uuid, second.gi_id)
    assert backend.create_instance(gpu_uuid, one, 4).gi_id == 2  # the lowest free id again
    media = model.profile("1g.18gb+me")
    backend.create_instance(gpu_uuid, media, 5)
    backend.destroy_instance(gpu_uuid, third.gi_id)
    with pytest.raises(BackendError, match="at most 1"):
        backend.create_instance(gpu_uuid, media, 6)  # memory slice 6 is free again, but one +me is the limit
    listed = {(i.profile, i.start, i.gi_id) for h in backend.discover() for g in h.gpus for i in g.instances}
    assert listed == {("3g.71gb", 0, 1), ("1g.18gb", 4, 2), ("1g.18gb+me", 5, 4)}
