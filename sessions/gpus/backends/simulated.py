"""The simulated GPU backend: a fleet described by a setting, obeying the catalog's rules.

Used where no NVIDIA driver answers. Its 'driver state' (the MIG instances
that exist) lives in the database, so every process sees the same devices.
UUIDs are derived from host, index and placement, so they are reproducible.
"""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sessions.gpus import agency, catalog, statements
from sessions.gpus.backends.base import (
    BackendError,
    DeviceSample,
    FoundGpu,
    FoundHost,
    FoundInstance,
    GpuSample,
)
from sessions.gpus.catalog import Profile
from sessions.gpus.placement import Layout, free_starts, why_not

NAMESPACE = uuid.UUID("5d0f3c1e-8d1a-4c52-9f0e-6a7b9c2d4e10")
ALIASES = catalog.ALIASES
DEFAULT_FLEET = "sim-1: 2xH200:mig, 1xA100-80GB:whole, 1xA30:shared=4"
HOST = re.compile(r"^(?P<host>[A-Za-z][\w.-]*)\s*:\s*(?P<items>\d.*)$")
ITEM = re.compile(r"^(?P<count>\d+)\s*x\s*(?P<model>[\w.-]+):(?P<mode>mig|whole|shared)(?:=(?P<limit>\d+))?$")


# Plausible figures per model family: board power (W) at rest and at full load, and the
# top SM and memory clocks (MHz) from NVIDIA's data sheets. The simulator moves between
# rest and load with what the containers on each slice are doing.
PHYSICS = {
    "H200": (90, 700, 1980, 3201),
    "H100": (80, 700, 1980, 2619),
    "A100": (55, 400, 1410, 1593),
    "A30": (30, 165, 1440, 1215),
    "L4": (16, 72, 2040, 6251),
    "L40S": (35, 350, 2520, 9001),
    "T4": (10, 70, 1590, 5001),
}
# Per-GPU-instance utilisation needs GPM, which NVML offers from Hopper on.
GPM_FAMILIES = {"H100", "H200"}
REST_SM_CLOCK_MHZ = 345
# GPU-instance ids the driver hands out, lowest free first (NVML numbers them from 1; 14 leaves room).
GI_IDS = range(1, 15)  # the GPU-instance ids a MIG device hands out
CONTEXT_MIB = 512  # what a CUDA context holds on a device that has a process


class FleetSpecError(ValueError):
    pass


@dataclass(frozen=True)
class SimulatedGpuSpec:
    host: str
    index: int
    model: catalog.GpuModel
    sharing: str
    share_limit: int

    @property
    def uuid(self) -> str:
        return f"GPU-{uuid.uuid5(NAMESPACE, f'{self.host}/{self.index}/{self.model.name}')}"

    def device_uuids(self) -> list[str]:
        """Every device UUID a container on this GPU may be given: the GPU's, and in MIG mode every instance's
        that could be made (what a lab host's NVIDIA stand-in knows, tests/lab)."""
        found = [self.uuid]
        if self.sharing == "mig":
            found += [mig_uuid(self.uuid, p.name, start) for p in self.model.profiles for start in p.placements]
        return found


def mig_uuid(gpu_uuid: str, profile: str, start: int) -> str:
    """The MIG device's UUID of an instance of ``profile`` at ``start`` (the same every time it is made)."""
    return f"MIG-{uuid.uuid5(NAMESPACE, f'{gpu_uuid}/{profile}/{start}')}"


def parse_fleet(spec: str, default_host: str = "sim-1") -> list[SimulatedGpuSpec]:
    """Parse e.g. 'sim-1: 2xH200:mig, 1xA30:shared=4; sim-2: 4xL4:whole'.

    Raises FleetSpecError naming the part that is wrong.
    """
    gpus: list[SimulatedGpuSpec] = []
    for host_part in filter(None, (part.strip() for part in spec.split(";"))):
        named = HOST.match(host_part)
        host, items = (named["host"], named["items"]) if named else (default_host, host_part)
        index = sum(1 for gpu in gpus if gpu.host == host)
        for item in filter(None, (piece.strip() for piece in items.split(","))):
            for gpu in _parse_item(host, item, index):
                gpus.append(gpu)
                index += 1
    if not gpus:
        raise FleetSpecError("the simulated fleet is empty")
    return gpus


def _parse_item(host: str, item: str, first_index: int) -> list[SimulatedGpuSpec]:
    match = ITEM.match(item.replace(" ", ""))
    if not match:
        raise FleetSpecError(f"{item!r} is not COUNTxMODEL:MODE (MODE: mig, whole or shared=N)")
    count = int(match["count"])
    if not 1 <= count <= 4096:
        raise FleetSpecError(f"{item!r}: the count must be between 1 and 4096")
    try:
        model = catalog.model(ALIASES.get(match["model"], match["model"]))
    except catalog.UnknownModel as error:
        raise FleetSpecError(f"{item!r}: {str(error).rstrip('.')}") from None
    if match["mode"] == "mig" and not model.mig_capable:
        raise FleetSpecError(f"{item!r}: {model.name} has no MIG")
    if match["limit"] and match["mode"] != "shared":
        raise FleetSpecError(f"{item!r}: only shared GPUs take a session limit (shared=N)")
    limit = int(match["limit"] or 4)
    if match["mode"] == "shared" and not 2 <= limit <= 64:
        raise FleetSpecError(f"{item!r}: a shared GPU takes 2 to 64 sessions")
    return [SimulatedGpuSpec(host, first_index + n, model, match["mode"], limit) for n in range(count)]


class SimulatedBackend:
    name = "simulated"

    def __init__(self, spec: str, hosts: Iterable[str] = ()) -> None:
        """The fleet ``spec`` describes; only its ``hosts`` where given (one Swarm node's share of it)."""
        fleet, wanted = parse_fleet(spec), set(hosts)
        unknown = sorted(wanted - {gpu.host for gpu in fleet})
        if unknown:
            raise BackendError(
                f"PORTAL_SIMULATED_HOSTS names {', '.join(unknown)}, which PORTAL_SIMULATED_FLEET does not have",
                code="config",
            )
        self.gpus = {gpu.uuid: gpu for gpu in fleet if not wanted or gpu.host in wanted}

    def discover(self) -> list[FoundHost]:
        from sessions.gpus.models import SimulatedGpuInstance

        existing: dict[str, list[FoundInstance]] = {}
        for row in SimulatedGpuInstance.objects.filter(gpu_uuid__in=self.gpus).order_by("start"):
            existing.setdefault(row.gpu_uuid, []).append(_found(row))
        by_uuid = {u: self._found_gpu(spec, existing.get(u, [])) for u, spec in self.gpus.items()}
        names = sorted({gpu.host for gpu in self.gpus.values()})
        return [
            FoundHost(
                name=name,
                backend=self.name,
                driver_version="simulated",
                gpus=[by_uuid[u] for u, spec in self.gpus.items() if spec.host == name],
            )
            for name in names
        ]

    def _found_gpu(self, gpu: SimulatedGpuSpec, instances: list[FoundInstance]) -> FoundGpu:
        return FoundGpu(
            index=gpu.index,
            uuid=gpu.uuid,
            product_name=f"NVIDIA {gpu.model.name} (simulated)",
            model_name=gpu.model.name,
            memory_mib=int(gpu.model.memory_gib * 1024),
            mig_capable=gpu.model.mig_capable,
            mig_enabled=gpu.sharing == "mig",
            mig_pending=gpu.sharing == "mig",
            sharing=gpu.sharing,
            share_limit=gpu.share_limit,
            instances=instances,
        )

    def _spec(self, gpu_uuid: str) -> SimulatedGpuSpec:
        if gpu_uuid in self.gpus:
            return self.gpus[gpu_uuid]
        # Another process may have discovered it under another fleet setting: the record is the truth.
        from sessions.gpus.models import Gpu

        gpu = Gpu.objects.filter(uuid=gpu_uuid, host__backend="simulated").select_related("host").first()
        if gpu is None:
            raise BackendError(f"no simulated GPU {gpu_uuid}", code="not_found")
        return SimulatedGpuSpec(gpu.host.name, gpu.index, gpu.catalog_model, gpu.sharing, gpu.share_limit)

    def _state(self, gpu_uuid: str, present: Sequence[FoundInstance] | None = None) -> tuple[Layout, set[int]]:
        """The simulated device's MIG layout and the GPU-instance ids in use: ``present`` as the caller just
        read it, else one plain query."""
        model = self._spec(gpu_uuid).model
        layout, used = Layout(), set()
        for found in self.instances(gpu_uuid) if present is None else present:
            layout = layout.with_instance(model.profile(found.profile), found.start)
            used.add(found.gi_id)
        return layout, used

    def sample(self, activity: Mapping[str, float], now: float | None = None) -> list[GpuSample]:
        """Figures that follow ``activity`` and are the same for the same second: tests can reason about them."""
        from sessions.gpus.models import SimulatedGpuInstance

        second = int(now if now is not None else time.time())
        instances: dict[str, list[tuple[int, str, str]]] = {}
        rows = SimulatedGpuInstance.objects.filter(gpu_uuid__in=self.gpus).order_by("start")
        for gpu_uuid, gi_id, profile, device in rows.values_list("gpu_uuid", "gi_id", "profile", "device_uuid"):
            instances.setdefault(gpu_uuid, []).append((gi_id, profile, device))
        return [
            _sample_gpu(spec, instances.get(gpu_uuid, []), activity, second) for gpu_uuid, spec in self.gpus.items()
        ]

    def possible_starts(self, gpu_uuid: str, profile: Profile) -> list[int]:
        spec = self._spec(gpu_uuid)
        if spec.sharing != "mig":
            return []
        return free_starts(spec.model, self._state(gpu_uuid)[0], profile)

    def instances(self, gpu_uuid: str) -> list[FoundInstance]:
        """The GPU's instances, in one plain (prepared) query."""
        from sessions.gpus.models import SimulatedGpuInstance

        table = SimulatedGpuInstance._meta.db_table
        sql = f"SELECT profile, start, size, gi_id, device_uuid FROM {table} WHERE gpu_uuid = %s ORDER BY start"
        return [
            FoundInstance(profile=profile, start=start, size=size, gi_id=gi_id, ci_id=0, device_uuid=device)
            for profile, start, size, gi_id, device in statements.rows(sql, [gpu_uuid])
        ]

    def create_instance(
        self, gpu_uuid: str, profile: Profile, start: int, present: Sequence[FoundInstance] | None = None
    ) -> FoundInstance:
        """Make the instance where the catalog's rules allow it, with the lowest free GPU-instance id,
        as the driver hands them out. Only the host's agent may (``sessions.gpus.agency``), as on a real host.

        Two plain statements (read the device unless ``present`` says what it holds, insert): measured, one
        INSERT ... SELECT checking the rules in SQL spent 0.4-0.7 ms planning, more than the second round trip
        costs. The insert is queued (``statements.queue``): in the agent's ``together()`` block it goes with
        the portal's own records of the instance and the order's result.
        """
        from sessions.gpus.models import SimulatedGpuInstance

        spec = self._spec(gpu_uuid)
        agency.require(spec.host, f"create a {profile.name} instance on {gpu_uuid}")
        if spec.sharing != "mig":
            raise BackendError(f"MIG mode is off on {gpu_uuid}", code="not_supported")
        layout, used = self._state(gpu_uuid, present)
        free_ids = [number for number in GI_IDS if number not in used]
        problem = why_not(spec.model, layout, profile, start) or ("" if free_ids else "no free GPU-instance id")
        if problem:
            raise BackendError(problem, code="insufficient_resources")
        device_uuid = mig_uuid(gpu_uuid, profile.name, start)
        statements.queue(
            f"INSERT INTO {SimulatedGpuInstance._meta.db_table}"
            " (gpu_uuid, gi_id, profile, start, size, device_uuid) VALUES (%s, %s, %s, %s, %s, %s)",
            [gpu_uuid, free_ids[0], profile.name, start, profile.placement_size, device_uuid],
        )
        return FoundInstance(
            profile=profile.name,
            start=start,
            size=profile.placement_size,
            gi_id=free_ids[0],
            ci_id=0,
            device_uuid=device_uuid,
        )

    def destroy_instance(self, gpu_uuid: str, gi_id: int) -> None:
        """Remove the instance; one that is not there is ``not_found``, as NVML says. What it deleted comes
        back as rows (``RETURNING``), which a pipelined statement gives where its row count does not."""
        from sessions.gpus.models import SimulatedGpuInstance

        agency.require(self._spec(gpu_uuid).host, f"destroy GPU instance {gi_id} on {gpu_uuid}")
        table = SimulatedGpuInstance._meta.db_table
        sql = f"DELETE FROM {table} WHERE gpu_uuid = %s AND gi_id = %s RETURNING gi_id"
        if not statements.rows(sql, [gpu_uuid, gi_id]):
            raise BackendError(f"no GPU instance {gi_id} on {gpu_uuid}", code="not_found")


def _found(row: object) -> FoundInstance:
    return FoundInstance(
        profile=row.profile,  # type: ignore[attr-defined]
        start=row.start,  # type: ignore[attr-defined]
        size=row.size,  # type: ignore[attr-defined]
        gi_id=row.gi_id,  # type: ignore[attr-defined]
        ci_id=0,
        device_uuid=row.device_uuid,  # type: ignore[attr-defined]
    )


def _jitter(key: str, second: int, spread: float) -> float:
    """A small, reproducible wobble: the same device in the same second always gets the same one."""
    return random.Random(f"{key}/{second}").uniform(0, spread)  # noqa: S311 - not for secrets


def _sample_gpu(
    spec: SimulatedGpuSpec, instances: list[tuple[int, str, str]], activity: Mapping[str, float], second: int
) -> GpuSample:
    model = spec.model
    rest_w, full_w, top_sm, memory_clock = PHYSICS[model.name.split("-")[0]]
    total_mib = model.memory_gib * 1024
    devices: list[DeviceSample] = []
    if spec.sharing == "mig":
        per_instance = model.name.split("-")[0] in GPM_FAMILIES
        for gi_id, name, device in instances:
            profile = model.profile(name)
            busy = activity.get(device)
            used = 0.0 if busy is None else CONTEXT_MIB + busy * 0.6 * profile.memory_gib * 1024
            util = None
            if per_instance:
                util = 0.0 if not busy else min(100.0, busy * 95 + _jitter(device, second, 5))
            devices.append(DeviceSample(device, gi_id, name, round(used, 1), profile.memory_gib * 1024, util))
        weights = [(model.profile(name).compute_slices, activity.get(device) or 0.0) for _, name, device in instances]
        load = sum(w * b for w, b in weights) / model.compute_slices
        utilization = None  # NVML has no whole-GPU utilisation while MIG is on
        memory_used = sum(d.memory_used_mib for d in devices)
        processes = sum(1 for d in devices if d.memory_used_mib)
    else:
        busy = activity.get(spec.uuid)
        load = min(1.0, busy or 0.0)
        utilization = 0.0 if not busy else min(100.0, busy * 97 + _jitter(spec.uuid, second, 3))
        memory_used = 0.0 if busy is None else CONTEXT_MIB + load * 0.5 * total_mib
        processes = 0 if busy is None else 1
    return GpuSample(
        uuid=spec.uuid,
        index=spec.index,
        model_name=model.name,
        utilization=None if utilization is None else round(utilization, 1),
        memory_used_mib=round(memory_used, 1),
        memory_total_mib=total_mib,
        temperature_c=round(31 + 48 * load + _jitter(spec.uuid + "/t", second, 1.5), 1),
        power_w=round(rest_w + (full_w - rest_w) * load + _jitter(spec.uuid + "/p", second, 4), 1),
        sm_clock_mhz=float(top_sm if load > 0.02 else REST_SM_CLOCK_MHZ),
        memory_clock_mhz=float(memory_clock),
        ecc_errors=0,
        processes=processes,
        devices=tuple(devices),
    )
