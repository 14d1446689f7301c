"""The NVML GPU backend: the real devices of this host, through NVIDIA's management library.

It only reads device state and creates or destroys MIG instances. It never changes MIG mode, resets a GPU or
touches clocks, power limits or persistence: those disturb every tenant of the card and are the operator's call.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pynvml

from sessions.gpus import agency, catalog
from sessions.gpus.backends.base import (
    BackendError,
    DeviceSample,
    FoundGpu,
    FoundHost,
    FoundInstance,
    GpuSample,
)
from sessions.gpus.catalog import GpuModel, Profile

log = logging.getLogger(__name__)

_CODES: tuple[tuple[Any, str], ...] = (
    (pynvml.NVMLError_NotSupported, "not_supported"),
    (pynvml.NVMLError_NoPermission, "no_permission"),
    (pynvml.NVMLError_InsufficientResources, "insufficient_resources"),
    (pynvml.NVMLError_NotFound, "not_found"),
)


def nvml_available() -> bool:
    """Whether an NVIDIA driver answers here; never raises, so the caller can fall back to the simulator."""
    try:
        pynvml.nvmlInit()
    except Exception as error:  # a missing library or driver, or anything odd, all mean "not here"
        log.debug("NVML is not available: %s", error)
        return False
    _shutdown()
    return True


def _refusal(message: str, code: str) -> BackendError:
    log.warning("NVML: %s", message)
    return BackendError(message, code=code)


def _translated_error(what: str, error: Exception) -> BackendError:
    code = next((code for kind, code in _CODES if isinstance(error, kind)), "driver")
    reason = str(error)
    if reason.startswith("NVML Error with code"):  # pynvml's text when the library has no words for it
        reason = type(error).__name__.removeprefix("NVMLError_")
    return _refusal(f"Could not {what}: {reason}", code)


@contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except pynvml.NVMLError as error:
        raise _translated_error(what, error) from error


@contextmanager
def _nvml(what: str) -> Iterator[None]:
    # NVML counts inits, so a session per call is cheap and leaves no global state between calls or threads.
    with _translated(f"start NVML to {what}"):
        pynvml.nvmlInit()
    try:
        with _translated(what):
            yield
    finally:
        _shutdown()


def _shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as error:
        log.warning("NVML: shutdown failed: %s", error)


def _catalog_model(product: str, memory_mib: int) -> GpuModel | None:
    return catalog.model_for_product_name(product, memory_mib)


def _mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def _listed(lister: Callable[..., Any], owner: Any, profile_id: int, capacity: int, element: Any) -> list[Any]:
    """Call one of NVML's fill-this-array functions; ``capacity`` is the profile's instanceCount."""
    items = (element * max(capacity, 1))()
    count = ctypes.c_uint(len(items))
    lister(owner, profile_id, items, ctypes.byref(count))
    return list(items[: count.value])


def _gi_profiles(device: Any) -> dict[int, Any]:
    """This device's GPU-instance profile infos by profile id (the id nvidia-smi and the catalog use)."""
    found: dict[int, Any] = {}
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, index)
        except pynvml.NVMLError:
            continue  # this device has no profile of that kind
        found.setdefault(info.id, info)
    return found


def _gi_profile(device: Any, gpu_uuid: str, profile: Profile) -> Any:
    info = _gi_profiles(device).get(profile.smi_profile_id)
    if info is None:
        message = f"GPU {gpu_uuid} offers no MIG profile {profile.name} (profile id {profile.smi_profile_id})"
        raise _refusal(message, "not_supported")
    return info


def _gi_infos(device: Any) -> list[Any]:
    """Every GPU instance on the device, of any profile, as nvmlGpuInstanceInfo_t."""
    infos: list[Any] = []
    for info in _gi_profiles(device).values():
        handles = _listed(
            pynvml.nvmlDeviceGetGpuInstances, device, info.id, info.instanceCount, pynvml.c_nvmlGpuInstance_t
        )
        infos.extend(pynvml.nvmlGpuInstanceGetInfo(handle) for handle in handles)
    return infos


def _compute_instances(gpu_instance: Any) -> list[Any]:
    handles: list[Any] = []
    seen: set[int] = set()
    for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        info = _ci_profile_info(gpu_instance, index)
        if info is None or info.id in seen:
            continue
        seen.add(info.id)
        lister = pynvml.nvmlGpuInstanceGetComputeInstances
        handles += _listed(lister, gpu_instance, info.id, info.instanceCount, pynvml.c_nvmlComputeInstance_t)
    return handles


def _ci_profile_info(gpu_instance: Any, index: int) -> Any | None:
    try:
        shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        return pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, index, shared)
    except pynvml.NVMLError:
        return None  # this GPU instance has no compute profile of that kind


def _full_ci_profile(gpu_instance: Any, slices: int) -> Any:
    """The compute-instance profile that takes the whole GPU instance, so the tenant gets all of it."""
    for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        info = _ci_profile_info(gpu_instance, index)
        if info is not None and info.sliceCount == slices:
            return info
    raise _refusal(f"no compute-instance profile spans all {slices} slices of the new GPU instance", "not_supported")


def _mig_devices(device: Any) -> dict[int, tuple[int, str]]:
    """GPU-instance id -> (compute-instance id, MIG device UUID) for every MIG device of the GPU."""
    found: dict[int, tuple[int, str]] = {}
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(device)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, index)
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue  # an index with no compute instance behind it
        gi_id = pynvml.nvmlDeviceGetGpuInstanceId(mig)
        found[gi_id] = (pynvml.nvmlDeviceGetComputeInstanceId(mig), pynvml.nvmlDeviceGetUUID(mig))
    return found


def _mig_modes(device: Any) -> tuple[bool, bool, bool]:
    """(capable, enabled now, enabled after the next reset)."""
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(device)
    except pynvml.NVMLError_NotSupported:
        return False, False, False
    enable = pynvml.NVML_DEVICE_MIG_ENABLE
    return True, current == enable, pending == enable


MIB = 1024 * 1024


def _read(getter: Callable[..., Any], *args: Any) -> Any:
    """One figure, or None where the device does not offer it (NOT_SUPPORTED on MIG, no permission...)."""
    try:
        return getter(*args)
    except pynvml.NVMLError as error:
        log.debug("NVML: %s: %s", getattr(getter, "__name__", getter), error)
        return None


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _ecc_errors(device: Any) -> int | None:
    count = _read(
        pynvml.nvmlDeviceGetTotalEccErrors,
        device,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    )
    return None if count is None else int(count)


def _free_quietly(sample: Any) -> None:
    try:
        pynvml.nvmlGpmSampleFree(sample)
    except pynvml.NVMLError as error:
        log.debug("NVML: freeing a GPM sample failed: %s", error)


def _destroy_quietly(gpu_instance: Any, what: str) -> None:
    # Used while another error is on its way out: that error is the one the caller must see.
    try:
        pynvml.nvmlGpuInstanceDestroy(gpu_instance)
    except pynvml.NVMLError as error:
        log.warning("NVML: could not roll back the GPU instance after failing to %s: %s", what, error)


class NvmlBackend:
    name = "nvml"

    def __init__(self, host_name: str) -> None:
        self.host_name = host_name
        self._sampling = False
        self._gpm: dict[tuple[str, int], Any] = {}  # the previous GPM sample per (GPU, GPU instance)

    def sample(self, activity: Mapping[str, float]) -> list[GpuSample]:
        """Read every GPU's figures. Read-only; a figure the device refuses is None, never 0."""
        if not self._sampling:  # the agent samples every second: keep NVML up instead of a session per call
            with _translated("start NVML to sample"):
                pynvml.nvmlInit()
            self._sampling = True
        with _translated("count the GPUs"):
            count = pynvml.nvmlDeviceGetCount()
        return [self._sample_gpu(index) for index in range(count)]

    def _sample_gpu(self, index: int) -> GpuSample:
        try:
            device = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = str(pynvml.nvmlDeviceGetUUID(device))
            memory = _read(pynvml.nvmlDeviceGetMemoryInfo, device)
            model = _catalog_model(str(pynvml.nvmlDeviceGetName(device)), int(memory.total) // MIB) if memory else None
        except pynvml.NVMLError as error:  # one bad GPU must not stop the others
            log.warning("NVML: cannot sample GPU %s: %s", index, error)
            return GpuSample("", index, "", None, None, None, None, None, None, None, None, None, problem=str(error))
        power = _read(pynvml.nvmlDeviceGetPowerUsage, device)
        utilization = _read(pynvml.nvmlDeviceGetUtilizationRates, device)
        processes = _read(pynvml.nvmlDeviceGetComputeRunningProcesses, device)
        return GpuSample(
            uuid=uuid,
            index=index,
            model_name=model.name if model else "",
            utilization=None if utilization is None else float(utilization.gpu),
            memory_used_mib=None if memory is None else int(memory.used) / MIB,
            memory_total_mib=None if memory is None else int(memory.total) / MIB,
            temperature_c=_number(_read(pynvml.nvmlDeviceGetTemperature, device, pynvml.NVML_TEMPERATURE_GPU)),
            power_w=None if power is None else int(power) / 1000,
            sm_clock_mhz=_number(_read(pynvml.nvmlDeviceGetClockInfo, device, pynvml.NVML_CLOCK_SM)),
            memory_clock_mhz=_number(_read(pynvml.nvmlDeviceGetClockInfo, device, pynvml.NVML_CLOCK_MEM)),
            ecc_errors=_ecc_errors(device),
            processes=None if processes is None else len(processes),
            devices=tuple(self._sample_mig(device, uuid)),
        )

    def _sample_mig(self, device: Any, gpu_uuid: str) -> Iterator[DeviceSample]:
        modes = _read(pynvml.nvmlDeviceGetMigMode, device)
        if not modes or modes[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        gpm = bool(getattr(_read(pynvml.nvmlGpmQueryDeviceSupport, device), "isSupportedDevice", 0))
        for index in range(_read(pynvml.nvmlDeviceGetMaxMigDeviceCount, device) or 0):
            mig = _read(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, device, index)
            if mig is None:
                continue
            gi_id = int(_read(pynvml.nvmlDeviceGetGpuInstanceId, mig) or 0)
            memory = _read(pynvml.nvmlDeviceGetMemoryInfo, mig)
            name = str(_read(pynvml.nvmlDeviceGetName, mig) or "")
            yield DeviceSample(
                uuid=str(pynvml.nvmlDeviceGetUUID(mig)),
                gi_id=gi_id,
                profile=name.rsplit(" ", 1)[-1] if "MIG" in name else "",
                memory_used_mib=0.0 if memory is None else int(memory.used) / MIB,
                memory_total_mib=0.0 if memory is None else int(memory.total) / MIB,
                utilization=self._gpm_utilization(device, gpu_uuid, gi_id) if gpm else None,
            )

    def _gpm_utilization(self, device: Any, gpu_uuid: str, gi_id: int) -> float | None:
        """Busy share of one GPU instance since the last tick, through GPM (Hopper and later)."""
        try:
            sample = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmMigSampleGet(device, gi_id, sample)
        except pynvml.NVMLError as error:
            log.debug("NVML: no GPM sample for %s/%s: %s", gpu_uuid, gi_id, error)
            return None
        previous = self._gpm.get((gpu_uuid, gi_id))
        self._gpm[(gpu_uuid, gi_id)] = sample
        if previous is None:
            return None
        try:
            query = pynvml.c_nvmlGpmMetricsGet_t()
            query.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            query.numMetrics = 1
            query.sample1, query.sample2 = previous, sample
            query.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
            pynvml.nvmlGpmMetricsGet(query)
            return round(float(query.metrics[0].value), 1)
        except pynvml.NVMLError as error:
            log.debug("NVML: GPM metrics failed for %s/%s: %s", gpu_uuid, gi_id, error)
            return None
        finally:
            _free_quietly(previous)

    def discover(self) -> list[FoundHost]:
        with _nvml(f"discover the GPUs of {self.host_name}"):
            found = [self._found_gpu(index) for index in range(pynvml.nvmlDeviceGetCount())]
            gpus = [gpu for gpu in found if gpu is not None]
            return [FoundHost(name=self.host_name, backend=self.name, driver_version=self._driver_version(), gpus=gpus)]

    def _driver_version(self) -> str:
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as error:
            _translated_error(f"read the driver version on {self.host_name}", error)  # logged; GPUs matter more
            return "unknown"

    def _found_gpu(self, index: int) -> FoundGpu | None:
        try:
            device = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = str(pynvml.nvmlDeviceGetUUID(device))
        except pynvml.NVMLError as error:
            # Without a UUID the GPU cannot be recorded; leaving it out marks its old record missing.
            _translated_error(f"identify GPU {index} on {self.host_name}", error)
            return None
        gpu = FoundGpu(
            index=index,
            uuid=uuid,
            product_name="",
            model_name="",
            memory_mib=0,
            mig_capable=False,
            mig_enabled=False,
            mig_pending=False,
        )
        try:
            with _translated(f"describe GPU {index} ({uuid}) on {self.host_name}"):
                self._describe(device, gpu)
        except BackendError as error:
            gpu.problem = "; ".join(filter(None, [gpu.problem, str(error)]))
        return gpu

    def _describe(self, device: Any, gpu: FoundGpu) -> None:
        gpu.product_name = str(pynvml.nvmlDeviceGetName(device))
        gpu.memory_mib = int(pynvml.nvmlDeviceGetMemoryInfo(device).total) // (1024 * 1024)
        model = _catalog_model(gpu.product_name, gpu.memory_mib)
        gpu.model_name = model.name if model else gpu.product_name
        if model is None:
            gpu.problem = f"no catalog model matches {gpu.product_name!r} with {gpu.memory_mib} MiB"
        gpu.mig_capable, gpu.mig_enabled, gpu.mig_pending = _mig_modes(device)
        gpu.sharing = "mig" if gpu.mig_enabled else "whole"
        if gpu.mig_enabled and model is not None:
            gpu.instances, problems = self._instances(device, model)
            gpu.problem = "; ".join(filter(None, [gpu.problem, *problems]))

    def _instances(self, device: Any, model: GpuModel) -> tuple[list[FoundInstance], list[str]]:
        profiles = {profile.smi_profile_id: profile for profile in model.profiles}
        devices = _mig_devices(device)
        found: list[FoundInstance] = []
        problems: list[str] = []
        for info in _gi_infos(device):
            profile = profiles.get(info.profileId)
            if profile is None:
                problems.append(f"GPU instance {info.id} has profile id {info.profileId}, unknown to {model.name}")
                continue
            ci_id, device_uuid = devices.get(info.id, (0, ""))
            start, size = info.placement.start, info.placement.size
            found.append(FoundInstance(profile.name, start, size, info.id, ci_id, str(device_uuid)))
        return sorted(found, key=lambda instance: instance.start), problems

    def possible_starts(self, gpu_uuid: str, profile: Profile) -> list[int]:
        with _nvml(f"list free {profile.name} placements on GPU {gpu_uuid}"):
            device = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            if not _mig_modes(device)[1]:
                return []
            info = _gi_profile(device, gpu_uuid, profile)
            # NVML lists every placement the profile allows, taken or not; the free ones are ours to find.
            taken = 0
            for existing in _gi_infos(device):
                taken |= _mask(existing.placement.start, existing.placement.size)
            return sorted(p.start for p in self._placements(device, info.id) if not taken & _mask(p.start, p.size))

    @staticmethod
    def _placements(device: Any, profile_id: int) -> list[Any]:
        count = ctypes.c_uint(0)
        # A null array asks only for the count, which sizes the real call.
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, None, ctypes.byref(count))
        if not count.value:
            return []
        items = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, items, ctypes.byref(count))
        return list(items[: count.value])

    def instances(self, gpu_uuid: str) -> list[FoundInstance]:
        with _nvml(f"list the MIG instances of GPU {gpu_uuid}"):
            device = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            memory_mib = int(pynvml.nvmlDeviceGetMemoryInfo(device).total) // (1024 * 1024)
            model = _catalog_model(str(pynvml.nvmlDeviceGetName(device)), memory_mib)
            if model is None or not _mig_modes(device)[1]:
                return []
            return self._instances(device, model)[0]

    def create_instance(
        self, gpu_uuid: str, profile: Profile, start: int, present: Sequence[FoundInstance] | None = None
    ) -> FoundInstance:
        what = f"create a {profile.name} instance at slice {start} on GPU {gpu_uuid}"
        agency.require(self.host_name, what)
        with _nvml(what):
            device = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            info = _gi_profile(device, gpu_uuid, profile)
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, profile.placement_size
            gpu_instance = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, info.id, ctypes.byref(placement))
            try:
                compute = pynvml.nvmlGpuInstanceCreateComputeInstance(
                    gpu_instance, _full_ci_profile(gpu_instance, info.sliceCount).id
                )
            except Exception:
                # A GPU instance without a compute instance is unusable and would hold its slices for nobody.
                _destroy_quietly(gpu_instance, what)
                raise
            return self._created(device, gpu_instance, compute, profile, what)

    @staticmethod
    def _created(device: Any, gpu_instance: Any, compute: Any, profile: Profile, what: str) -> FoundInstance:
        gi = pynvml.nvmlGpuInstanceGetInfo(gpu_instance)
        ci = pynvml.nvmlComputeInstanceGetInfo(compute)
        _, device_uuid = _mig_devices(device).get(gi.id, (ci.id, ""))
        if not device_uuid:
            # Without its MIG UUID no container could be given the instance: undo and say so.
            _destroy_quietly(gpu_instance, what)
            raise _refusal(f"no MIG device appeared after the call to {what} (GPU instance {gi.id})", "driver")
        return FoundInstance(profile.name, gi.placement.start, gi.placement.size, gi.id, ci.id, str(device_uuid))

    def destroy_instance(self, gpu_uuid: str, gi_id: int) -> None:
        agency.require(self.host_name, f"destroy GPU instance {gi_id} on GPU {gpu_uuid}")
        with _nvml(f"destroy GPU instance {gi_id} on GPU {gpu_uuid}"):
            device = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            gpu_instance = pynvml.nvmlDeviceGetGpuInstanceById(device, gi_id)
            # NVML refuses to destroy a GPU instance that still holds compute instances.
            for compute in _compute_instances(gpu_instance):
                pynvml.nvmlComputeInstanceDestroy(compute)
            pynvml.nvmlGpuInstanceDestroy(gpu_instance)
