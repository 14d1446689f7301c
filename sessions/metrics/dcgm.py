"""A metrics source that reads NVIDIA's dcgm-exporter instead of NVML (``PORTAL_METRICS_SOURCE=dcgm``), for
GPU nodes where the GPU Operator already runs it: the agent's samples come from its Prometheus text
(``PORTAL_DCGM_EXPORTER_URL``, port 9400 by default), and the same frames, history and ``/metrics`` follow.

Everything else (discovery, MIG instances, the host's identity) stays the backend's: this wraps it and replaces
``sample`` alone. What dcgm-exporter gives, and how it is read:

- one row per GPU, labelled ``UUID``, ``gpu`` (its index) and ``modelName``: utilisation, framebuffer used and
  free (MiB), temperature, power, SM and memory clocks, and the volatile double-bit ECC errors where counted;
- one row per MIG device, labelled with its parent's ``UUID`` and its ``GPU_I_ID`` and ``GPU_I_PROFILE``:
  framebuffer used and free, and the profiling field ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a ratio) where the
  exporter collects it. Its ``DCGM_FI_DEV_GPU_UTIL`` reads 0 under MIG, which would show a busy slice as
  idle: it is never taken for a MIG device, nor for a GPU in MIG mode, with instances or not (None:
  unavailable, never 0).

A MIG row names no device UUID: it is found from the backend's instances by (GPU, GPU-instance id), asked
again when a row names an instance not seen yet. A GPU the exporter does not list is sampled with its problem
said (the exporter away: every GPU so), as the NVML backend says why a GPU could not be read.
"""

from __future__ import annotations

import logging
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sessions.gpus.backends.base import DeviceSample, GpuBackend, GpuSample

log = logging.getLogger(__name__)

UTIL, FB_USED, FB_FREE = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
TEMP, POWER, SM_CLOCK, MEM_CLOCK = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
)
ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
REDISCOVER_AFTER_S = 5.0
Row = dict[str, float]


def read_rows(text: str) -> tuple[dict[str, Row], dict[tuple[str, int], Row], dict[str, dict[str, str]]]:
    """The exporter's text as GPU rows by UUID, MIG rows by (parent UUID, GPU-instance id), and each GPU's
    labels; samples without a UUID (the exporter's own figures) are skipped."""
    gpus: dict[str, Row] = {}
    migs: dict[tuple[str, int], Row] = {}
    labels: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            uuid = sample.labels.get("UUID", "")
            if not uuid:
                continue
            if sample.labels.get("GPU_I_ID", "") != "":
                key = (uuid, int(sample.labels["GPU_I_ID"]))
                migs.setdefault(key, {})[sample.name] = float(sample.value)
                labels.setdefault(f"{uuid}#{key[1]}", dict(sample.labels))
            else:
                gpus.setdefault(uuid, {})[sample.name] = float(sample.value)
                labels.setdefault(uuid, dict(sample.labels))
    return gpus, migs, labels


class DcgmSource:
    """The backend, sampled through dcgm-exporter. Everything but ``sample`` is the backend's own."""

    def __init__(self, backend: GpuBackend, url: str, timeout_s: float = 2.0) -> None:
        self.backend, self.url, self.timeout_s = backend, url, timeout_s
        self._devices: dict[tuple[str, int], str] = {}
        self._gpus: dict[str, tuple[int, str]] = {}  # uuid -> (index, model name), as discovered
        self._mig_mode: set[str] = set()
        self._discovered_at = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def _discover(self) -> None:
        self._devices, self._gpus, self._mig_mode = {}, {}, set()
        for host in self.backend.discover():
            for gpu in host.gpus:
                self._gpus[gpu.uuid] = (gpu.index, gpu.model_name)
                if gpu.mig_enabled:
                    self._mig_mode.add(gpu.uuid)
                for instance in gpu.instances:
                    self._devices[(gpu.uuid, instance.gi_id)] = instance.device_uuid
        self._discovered_at = time.monotonic()

    def _fetch(self) -> str:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:  # noqa: S310  # the node's exporter
            return str(response.read().decode())

    def sample(self, activity: Mapping[str, float]) -> list[GpuSample]:
        """Every discovered GPU's figures as the exporter gives them now (``activity`` is the simulated
        backend's input; a real exporter measures)."""
        if not self._gpus:
            self._discover()
        try:
            gpus, migs, labels = read_rows(self._fetch())
        except (OSError, ValueError) as error:
            log.warning("dcgm-exporter at %s: %s", self.url, error)
            return [self._unread(uuid, f"dcgm-exporter at {self.url} did not answer: {error}") for uuid in self._gpus]
        unknown = {key for key in migs if key not in self._devices}
        if unknown and time.monotonic() - self._discovered_at > REDISCOVER_AFTER_S:
            self._discover()  # an instance made since: its device UUID
        samples = []
        for uuid in self._gpus:
            row = gpus.get(uuid)
            if row is None:
                samples.append(self._unread(uuid, f"dcgm-exporter at {self.url} does not list {uuid}"))
                continue
            devices = tuple(
                self._device(uuid, gi_id, figures, labels[f"{uuid}#{gi_id}"])
                for (gpu, gi_id), figures in sorted(migs.items())
                if gpu == uuid and (uuid, gi_id) in self._devices
            )
            mig_mode = uuid in self._mig_mode or any(gpu == uuid for gpu, _ in migs)
            samples.append(self._gpu(uuid, row, devices, mig_mode))
        return samples

    def _unread(self, uuid: str, problem: str) -> GpuSample:
        index, model = self._gpus[uuid]
        return GpuSample(uuid, index, model, None, None, None, None, None, None, None, None, None, (), problem)

    def _gpu(self, uuid: str, row: Row, devices: tuple[DeviceSample, ...], mig_mode: bool) -> GpuSample:
        index, model = self._gpus[uuid]
        used, free = row.get(FB_USED), row.get(FB_FREE)
        ecc = row.get(ECC_DBE)
        return GpuSample(
            uuid=uuid,
            index=index,
            model_name=model,
            utilization=None if mig_mode else row.get(UTIL),
            memory_used_mib=used,
            memory_total_mib=None if used is None or free is None else used + free,
            temperature_c=row.get(TEMP),
            power_w=row.get(POWER),
            sm_clock_mhz=row.get(SM_CLOCK),
            memory_clock_mhz=row.get(MEM_CLOCK),
            ecc_errors=None if ecc is None else int(ecc),
            processes=None,  # the exporter does not count them
            devices=devices,
        )

    def _device(self, uuid: str, gi_id: int, figures: Row, labels: Mapping[str, str]) -> DeviceSample:
        used, free = figures.get(FB_USED, 0.0), figures.get(FB_FREE, 0.0)
        active = figures.get(ENGINE_ACTIVE)
        return DeviceSample(
            uuid=self._devices[(uuid, gi_id)],
            gi_id=gi_id,
            profile=labels.get("GPU_I_PROFILE", ""),
            memory_used_mib=used,
            memory_total_mib=used + free,
            utilization=None if active is None else round(active * 100, 1),
        )
