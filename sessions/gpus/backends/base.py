"""The interface every GPU backend implements, and the values it speaks in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sessions.gpus.catalog import Profile


class BackendError(RuntimeError):
    """A GPU operation the host refused or does not support; ``code`` names the kind."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class FoundInstance:
    profile: str
    start: int
    size: int
    gi_id: int
    ci_id: int
    device_uuid: str


@dataclass
class FoundGpu:
    index: int
    uuid: str
    product_name: str
    model_name: str
    memory_mib: int
    mig_capable: bool
    mig_enabled: bool
    mig_pending: bool
    sharing: str = ""
    share_limit: int = 4
    instances: list[FoundInstance] = field(default_factory=list)
    problem: str = ""


@dataclass
class FoundHost:
    name: str
    backend: str
    driver_version: str
    gpus: list[FoundGpu]


@dataclass(frozen=True)
class DeviceSample:
    """One MIG device's figures. ``utilization`` is None where the hardware offers none per instance."""

    uuid: str
    gi_id: int
    profile: str
    memory_used_mib: float
    memory_total_mib: float
    utilization: float | None


@dataclass(frozen=True)
class GpuSample:
    """One physical GPU's figures at one moment; a None figure is one the device does not report.

    ``problem`` says why a GPU could not be sampled at all (its figures are then None).
    """

    uuid: str
    index: int
    model_name: str
    utilization: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature_c: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    memory_clock_mhz: float | None
    ecc_errors: int | None
    processes: int | None
    devices: tuple[DeviceSample, ...] = ()
    problem: str = ""


class GpuBackend(Protocol):
    name: str

    def discover(self) -> list[FoundHost]:
        """Every host this backend speaks for, each GPU with its MIG mode and MIG instances."""

    def possible_starts(self, gpu_uuid: str, profile: Profile) -> list[int]:
        """Where the device says an instance of ``profile`` could be created now."""

    def instances(self, gpu_uuid: str) -> list[FoundInstance]:
        """The MIG instances on one GPU now, as the device lists them."""

    def create_instance(
        self, gpu_uuid: str, profile: Profile, start: int, present: Sequence[FoundInstance] | None = None
    ) -> FoundInstance:
        """Create a GPU instance (and its compute instance) at ``start``. ``present``: the GPU's instances as
        the caller has just read them from this backend (``instances``), which a backend may take instead of
        reading again; a real driver checks for itself anyway."""

    def destroy_instance(self, gpu_uuid: str, gi_id: int) -> None:
        """Destroy a GPU instance and its compute instances."""

    def sample(self, activity: Mapping[str, float]) -> list[GpuSample]:
        """Every GPU's figures now. ``activity`` (device or GPU UUID -> 0..1) is what the containers on
        each slice are doing; real devices ignore it, the simulator follows it."""
