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


@dataclass(frozen=True)
class Limits:
    cpus: float
    memory_bytes: int
    pids: int

    def at_most(self, host_cpus: int | None) -> Limits:
        """No container may ask for more CPUs than its host has."""
        return self if not host_cpus else replace(self, cpus=min(self.cpus, float(host_cpus)))


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
            # Removed by whoever started it, never by the engine on exit: the moment it died is read first (billing).
            "auto_remove": False,
        }
        if self.bridged:
            config["sysctls"] = dict(NO_IPV6)
        return config

    def with_cpus_at_most(self, host_cpus: int | None) -> ContainerSpec:
        return replace(self, limits=self.limits.at_most(host_cpus))

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "device_ids": list(self.device_ids),
            "cpus": self.limits.cpus,
            "mem_bytes": self.limits.memory_bytes,
            "pids": self.limits.pids,
            "labels": dict(self.labels),
            "network": self.network,
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
        )
