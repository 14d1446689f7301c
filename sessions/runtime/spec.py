"""What a GPU container runs with: its device, limits, labels and hardening, as one plain value.

Built once per container by ``sessions.runtime.slices.spec_for`` and applied by
both launch paths: the Docker adapter (batch work) and the hub's spawner (notebooks,
which receives it as JSON from the portal's internal API). No Django and no Docker
here, so the spawner, which runs in the hub's process, applies the very same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

LABEL_PREFIX = "gpu-portal"
# Which portal a container belongs to: a second portal (or test run) on the same engine never touches ours.
INSTANCE_LABEL = f"{LABEL_PREFIX}.instance"
GIB = 1024**3
# What every user container runs with: no privilege gain, no capabilities (its user is not root anyway).
HARDENING: dict[str, list[str]] = {
    "security_opt": ["no-new-privileges:true"],
    "cap_drop": ["ALL"],
}
# IPv6 off inside containers on a bridge: the bridge's firewall does not route it. net.* sysctls belong to
# a container's own network namespace, so none on the host's network (and "none" has no interface to fence).
NO_IPV6 = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
HOST_NETWORK = "host"
NO_NETWORK = "none"  # render jobs and other batch work: an uploaded scene is hostile
# The most of its host's memory one container may be given, whatever its slice's share: the rest stays for the
# host (the engine, the portal, its database), which a container at the host's whole memory would starve.
HOST_MEMORY_SHARE = (3, 4)


@dataclass(frozen=True)
class Limits:
    cpus: float
    memory_bytes: int
    pids: int

    def at_most(self, host_cpus: int | None, host_memory_bytes: int | None = None) -> Limits:
        """No container may ask for more CPUs than its host has, nor more memory than ``HOST_MEMORY_SHARE`` of
        the host's."""
        found = self if not host_cpus else replace(self, cpus=min(self.cpus, float(host_cpus)))
        if host_memory_bytes:
            share, whole = HOST_MEMORY_SHARE
            found = replace(found, memory_bytes=min(found.memory_bytes, host_memory_bytes * share // whole))
        return found


@dataclass(frozen=True)
class LogLimits:
    """What a container's output may take on the host's disk: the engine's json-file log, rotated at
    ``max_bytes`` and ``files`` files kept (the oldest dropped)."""

    max_bytes: int = 10 * 1024**2
    files: int = 3

    def log_config(self) -> dict[str, Any]:
        return {"type": "json-file", "config": {"max-size": str(self.max_bytes), "max-file": str(self.files)}}


def limits(
    compute_slices: int, memory_gib: float, cpus_per_compute_slice: int, memory_per_gpu_gib: int, pids: int
) -> Limits:
    """Host CPU and memory in proportion to the slice: a bigger GPU share gets more of the host."""
    cpus = max(1.0, compute_slices * float(cpus_per_compute_slice))
    memory = max(4 * GIB, int(memory_gib * memory_per_gpu_gib * GIB))
    return Limits(cpus=cpus, memory_bytes=memory, pids=pids)


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    device_ids: tuple[str, ...]
    limits: Limits
    labels: Mapping[str, str] = field(default_factory=dict)
    network: str = NO_NETWORK
    logs: LogLimits = LogLimits()

    @property
    def bridged(self) -> bool:
        return self.network not in (HOST_NETWORK, NO_NETWORK)

    def host_config(self) -> dict[str, Any]:
        """The container's host configuration in docker-py's words (``create_host_config``, or the keyword
        arguments of ``containers.create``)."""
        config: dict[str, Any] = {
            "device_requests": [{"driver": "nvidia", "device_ids": list(self.device_ids), "capabilities": [["gpu"]]}],
            "nano_cpus": int(self.limits.cpus * 1e9),
            "mem_limit": self.limits.memory_bytes,
            "pids_limit": self.limits.pids,
            **{key: list(value) for key, value in HARDENING.items()},
            "network_mode": self.network,
            "log_config": self.logs.log_config(),
            # Removed by whoever started it, never by the engine on exit: the moment it died is read first (billing).
            "auto_remove": False,
        }
        if self.bridged:
            config["sysctls"] = dict(NO_IPV6)
        return config

    def service_parts(self) -> dict[str, Any]:
        """The same container as a Swarm service's task, in docker-py's words (``ContainerSpec`` and
        ``Resources`` keyword arguments, the log driver, the environment to add, the pids limit that docker-py's
        ``Resources`` has no argument for). Docker 20.10's services cannot carry device requests: the slice goes
        in ``NVIDIA_VISIBLE_DEVICES``, which the node's default runtime (NVIDIA's) turns into the device; nor
        ``no-new-privileges`` (services have it from Docker 25): made up for by no capabilities at all and the
        image's unprivileged user, so there is no privilege to gain."""
        container: dict[str, Any] = {"cap_drop": list(HARDENING["cap_drop"]), "labels": dict(self.labels)}
        if self.network != NO_NETWORK:
            container["sysctls"] = dict(NO_IPV6)
        return {
            "container": container,
            "resources": {"cpu_limit": int(self.limits.cpus * 1e9), "mem_limit": self.limits.memory_bytes},
            "pids": self.limits.pids,
            "log_driver": {"name": "json-file", "options": self.logs.log_config()["config"]},
            "env": {"NVIDIA_VISIBLE_DEVICES": ",".join(self.device_ids)},
        }

    def within_host(self, host_cpus: int | None, host_memory_bytes: int | None = None) -> ContainerSpec:
        """The spec with its limits cut to what its host has (``Limits.at_most``)."""
        return replace(self, limits=self.limits.at_most(host_cpus, host_memory_bytes))

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "device_ids": list(self.device_ids),
            "cpus": self.limits.cpus,
            "mem_bytes": self.limits.memory_bytes,
            "pids": self.limits.pids,
            "labels": dict(self.labels),
            "network": self.network,
            "log_max_bytes": self.logs.max_bytes,
            "log_files": self.logs.files,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ContainerSpec:
        """The spec as the internal API sent it; KeyError, TypeError or ValueError if it is not one."""
        labels = data["labels"]
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise TypeError("labels must map names to text")
        return cls(
            image=str(data["image"]),
            device_ids=tuple(str(device) for device in data["device_ids"]),
            limits=Limits(cpus=float(data["cpus"]), memory_bytes=int(data["mem_bytes"]), pids=int(data["pids"])),
            labels={str(k): v for k, v in labels.items()},
            network=str(data["network"]),
            logs=LogLimits(max_bytes=int(data["log_max_bytes"]), files=int(data["log_files"])),
        )
