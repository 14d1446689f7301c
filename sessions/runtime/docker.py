"""The Docker adapter: the only module that imports ``docker``.

It applies a slice's container spec (``sessions.runtime.spec``: the device
request the NVIDIA Container Toolkit reads, limits, labels, hardening) to the
engine, and runs, inspects and removes such containers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import docker
from django.conf import settings
from docker.errors import APIError, DockerException, NotFound
from docker.types import IPAMConfig, IPAMPool

from sessions.gpus.models import Slice
from sessions.runtime.engine_client import tls_for
from sessions.runtime.network import UserNetwork
from sessions.runtime.slices import spec_for
from sessions.runtime.spec import HARDENING, INSTANCE_LABEL, LABEL_PREFIX, ContainerSpec
from sessions.runtime.times import engine_time


class RuntimeError_(RuntimeError):
    """The Docker engine refused or failed; the message says what was being done."""


@dataclass(frozen=True)
class ContainerState:
    running: bool
    finished_at: datetime | None
    exit_code: int | None = None
    oom_killed: bool = False
    started_at: datetime | None = None

    @classmethod
    def of(cls, attrs: dict[str, Any]) -> ContainerState:
        """The state in a container's inspect document."""
        state = attrs["State"]
        finished = engine_time(str(state.get("FinishedAt", "")))
        exit_code = None if state.get("Running") or finished is None else int(state.get("ExitCode", 0))
        started = engine_time(str(state.get("StartedAt", "")))
        return cls(bool(state.get("Running")), finished, exit_code, bool(state.get("OOMKilled")), started)


def ours(*labels: str) -> dict[str, list[str]]:
    """A Docker filter for this portal's containers carrying these labels."""
    return {"label": [f"{INSTANCE_LABEL}={settings.INSTANCE_ID}", *labels]}


def container_options(spec: ContainerSpec, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for ``containers.create``: the spec's device, limits, labels and hardening."""
    options: dict[str, Any] = {"image": spec.image, "labels": dict(spec.labels), "detach": True, **spec.host_config()}
    options.update(overrides)
    return options


class DockerRuntime:
    files_here = True  # a render sandbox's folders are mounted from this machine (``sessions.runtime.sandbox``)

    def __init__(self, base_url: str | None = None) -> None:
        try:
            self.client = (
                docker.DockerClient(base_url=base_url, tls=tls_for(base_url, settings.DOCKER_TLS_DIR))
                if base_url
                else docker.from_env()
            )
        except DockerException as error:
            raise RuntimeError_(f"cannot reach the Docker engine: {error}") from None
        self._host_cpus: int | None = None
        self._host_memory: int | None = None

    def start_for_slice(
        self, taken: Slice, image: str, *, labels: dict[str, str] | None = None, **overrides: Any
    ) -> str:
        """Create and start a container on the slice (no network: batch work); returns its id."""
        try:
            spec = self.within_host(spec_for(taken, image, labels=labels))
            options = container_options(spec, **overrides)
            container = self.client.containers.create(**options)
            container.start()
        except DockerException as error:
            raise RuntimeError_(f"starting a container for slice {taken.pk} failed: {error}") from None
        return str(container.id)

    def start(self, spec: ContainerSpec, command: list[str], **overrides: Any) -> str:
        """Create and start a container of the spec (its CPUs cut to the host's) running ``command``;
        returns its id. If it cannot start, no container is left behind."""
        container_id = self.create(spec, command, **overrides)
        self.start_created(container_id, spec.image)
        return container_id

    def create(self, spec: ContainerSpec, command: list[str], **overrides: Any) -> str:
        """Create, not start, a container of the spec (its CPUs cut to the host's) running ``command``."""
        options = container_options(self.within_host(spec), command=command, **overrides)
        try:
            return str(self.client.containers.create(**options).id)
        except DockerException as error:
            raise RuntimeError_(f"starting a container of {spec.image} failed: {error}") from None

    def start_created(self, container_id: str, image: str) -> None:
        """Start a created container; if it cannot start, it is removed."""
        try:
            self.client.containers.get(container_id).start()
        except DockerException as error:
            self.remove(container_id)
            raise RuntimeError_(f"starting a container of {image} failed: {error}") from None

    def run_briefly(self, image: str, command: list[str], user: str, volumes: dict[str, dict[str, str]]) -> int:
        """Run a short chore of ours in a container of this portal with no network, no device, no capability,
        a read-only root and only ``volumes`` mounted; its exit status once it ended (it is then removed)."""
        return self.run_chore(image, command, user, volumes)[0]

    def run_chore(
        self,
        image: str,
        command: list[str],
        user: str,
        volumes: dict[str, dict[str, str]],
        capabilities: tuple[str, ...] = (),
        timeout: float = 120,
    ) -> tuple[int, str]:
        """``run_briefly``, with ``capabilities`` given back (a chore that reads what others' files hide needs
        DAC_READ_SEARCH) and what it printed; it is killed and removed past ``timeout`` seconds."""
        options = {
            "image": image,
            "command": command,
            "user": user,
            "volumes": volumes,
            "labels": {INSTANCE_LABEL: settings.INSTANCE_ID, f"{LABEL_PREFIX}.chore": "1"},
            "network_mode": "none",
            "read_only": True,
            "pids_limit": 64,
            "mem_limit": 256 * 1024**2,
            **{key: list(value) for key, value in HARDENING.items()},
            "cap_add": list(capabilities),
        }
        container_id = None
        try:
            container_id = str(self.client.containers.create(**options).id)
            self.client.containers.get(container_id).start()
            status = self.wait(container_id, timeout=timeout)
            return status, bytes(self.client.containers.get(container_id).logs(stderr=False)).decode(errors="replace")
        except (DockerException, OSError) as error:  # the SDK's timeouts are OSErrors
            raise RuntimeError_(f"running {command[0]} in a container of {image} failed: {error}") from None
        finally:
            if container_id is not None:
                self.remove(container_id)

    def volume_names(self) -> set[str]:
        """The names of every volume the engine has (a name mounted that is not among them would be made)."""
        try:
            return {str(volume.name) for volume in self.client.volumes.list()}
        except DockerException as error:
            raise RuntimeError_(f"listing the engine's volumes failed: {error}") from None

    def session_layers(self) -> dict[int, int]:
        """What each notebook session's container wrote outside its volumes (its writable layer, the engine's
        SizeRw), by its session's number; the engine walks each layer to tell."""
        try:
            found = self.client.api.containers(all=True, size=True, filters=ours(f"{LABEL_PREFIX}.session"))
        except DockerException as error:
            raise RuntimeError_(f"reading the notebook containers' sizes failed: {error}") from None
        layers: dict[int, int] = {}
        for container in found:
            session = int(container["Labels"][f"{LABEL_PREFIX}.session"])
            layers[session] = layers.get(session, 0) + int(container.get("SizeRw") or 0)
        return layers

    def output_lines(self, container_id: str, longest: int = 64 * 1024) -> Iterator[str]:
        """What a container prints, stdout and stderr as they interleave, line by line as it comes, until
        it exits. A line longer than ``longest`` bytes comes in pieces: a program cannot make us hold more."""
        pending = b""
        try:
            for chunk in self.client.containers.get(container_id).logs(stream=True, follow=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                while len(pending) > longest:
                    lines.append(pending[:longest])
                    pending = pending[longest:]
                yield from (line.decode(errors="replace") for line in lines)
        except DockerException as error:
            raise RuntimeError_(f"reading the output of container {container_id[:12]} failed: {error}") from None
        if pending:
            yield pending.decode(errors="replace")

    def kill(self, container_id: str) -> bool:
        """Kill a container at once (SIGKILL); False if it had already stopped or gone."""
        try:
            self.client.containers.get(container_id).kill()
        except NotFound:
            return False
        except APIError as error:
            if error.status_code == 409:  # not running
                return False
            raise RuntimeError_(f"killing container {container_id[:12]} failed: {error}") from None
        return True

    def exit_of(self, container_id: str, timeout: float = 30) -> ContainerState:
        """Wait for a container to exit, then its state as the engine recorded it."""
        try:
            container = self.client.containers.get(container_id)
            container.wait(timeout=timeout)
            container.reload()
        except DockerException as error:
            raise RuntimeError_(f"waiting for container {container_id[:12]} failed: {error}") from None
        return ContainerState.of(container.attrs)

    def host_cpus(self) -> int:
        """CPUs of the engine's host: no container may ask for more."""
        if self._host_cpus is None:
            self._host_cpus = int(self.client.info()["NCPU"])
        return self._host_cpus

    def host_memory(self) -> int:
        """Bytes of memory of the engine's host: no container may be given more than its share of them."""
        if self._host_memory is None:
            self._host_memory = int(self.client.info()["MemTotal"])
        return self._host_memory

    def within_host(self, spec: ContainerSpec) -> ContainerSpec:
        """The spec with its CPUs and memory cut to what this engine's host has."""
        return spec.within_host(self.host_cpus(), self.host_memory())

    def wait(self, container_id: str, timeout: float = 60) -> int:
        result = self.client.containers.get(container_id).wait(timeout=timeout)
        return int(result["StatusCode"])

    def logs(self, container_id: str) -> str:
        return bytes(self.client.containers.get(container_id).logs()).decode(errors="replace")

    def remove(self, container_id: str) -> None:
        try:
            self.client.containers.get(container_id).remove(force=True)
        except NotFound:
            return

    def containers_for(self, label: str, value: str | None = None) -> list[str]:
        """Ids of our containers carrying a label (with this value, if one is given)."""
        wanted = f"{LABEL_PREFIX}.{label}" if value is None else f"{LABEL_PREFIX}.{label}={value}"
        found = self.client.containers.list(all=True, filters=ours(wanted))
        return [str(container.id) for container in found]

    def containers_on(self, network_name: str) -> list[str]:
        """Ids of every container attached to a network, running or not."""
        found = self.client.containers.list(all=True, filters={"network": network_name})
        return [str(container.id) for container in found]

    def networks_named(self, prefix: str) -> list[tuple[str, str, datetime | None]]:
        """Our user-container networks whose name starts with ``prefix``: (name, subnet, created)."""
        found = self.client.networks.list(filters={"label": f"{LABEL_PREFIX}.network"})
        result = []
        for item in found:
            if item.name.startswith(prefix):
                pools = item.attrs.get("IPAM", {}).get("Config") or [{}]
                result.append(
                    (str(item.name), str(pools[0].get("Subnet", "")), engine_time(item.attrs.get("Created", "")))
                )
        return result

    def session_containers(self) -> dict[str, int]:
        """Every container of a notebook session, by id, with its session's number."""
        found = self.client.containers.list(all=True, filters=ours(f"{LABEL_PREFIX}.session"))
        return {str(c.id): int(c.labels[f"{LABEL_PREFIX}.session"]) for c in found}

    def container_state(self, session_id: int) -> ContainerState | None:
        """Whether a session's container runs, and when it stopped; None if there is none."""
        found = self.client.containers.list(all=True, filters=ours(f"{LABEL_PREFIX}.session={session_id}"))
        return ContainerState.of(found[0].attrs) if found else None

    def died_at(self, session_id: int, since: datetime) -> datetime | None:
        """When the engine saw a session's container die, from its event log: right even after the
        container was removed (by hand, or by an engine that auto-removes)."""
        try:
            # As decimal strings: the SDK would cut datetimes to whole seconds and miss the last one.
            events = self.client.events(
                since=f"{since.timestamp():.6f}",
                until=f"{datetime.now(UTC).timestamp():.6f}",
                decode=True,
                filters={"type": "container", "event": "die", **ours(f"{LABEL_PREFIX}.session={session_id}")},
            )
            moments = [datetime.fromtimestamp(int(event["timeNano"]) / 1e9, UTC) for event in events]
        except DockerException as error:
            raise RuntimeError_(f"reading the engine's events for session {session_id} failed: {error}") from None
        return min(moments) if moments else None

    def ensure_network(self, network: UserNetwork) -> str:
        """Create the user-container bridge if it is missing; refuse one that exists with other settings.

        Inter-container traffic is off: two people's notebooks never talk to each other.
        """
        options = {
            "com.docker.network.bridge.name": network.bridge,
            "com.docker.network.bridge.enable_icc": "false",
        }
        try:
            found = self.client.networks.list(names=[network.name])
            existing = next((n for n in found if n.name == network.name), None)
            if existing is None:
                pool = IPAMPool(subnet=str(network.subnet), gateway=network.gateway)
                created = self.client.networks.create(
                    network.name,
                    driver="bridge",
                    options=options,
                    ipam=IPAMConfig(pool_configs=[pool]),
                    labels={f"{LABEL_PREFIX}.network": "user-containers"},
                )
                return str(created.id)
        except DockerException as error:
            raise RuntimeError_(f"creating the Docker network {network.name} failed: {error}") from None
        self._check_network(existing.attrs, network, options)
        return str(existing.id)

    @staticmethod
    def _check_network(attrs: dict[str, Any], network: UserNetwork, options: dict[str, str]) -> None:
        subnets = [str(pool.get("Subnet")) for pool in (attrs.get("IPAM", {}).get("Config") or [])]
        have = attrs.get("Options") or {}
        if (
            attrs.get("Driver") != "bridge"
            or subnets != [str(network.subnet)]
            or any(have.get(key) != value for key, value in options.items())
        ):
            raise RuntimeError_(
                f"the Docker network {network.name} exists with other settings (subnet {subnets}, options {have}); "
                f"remove it (docker network rm {network.name}) or pick another PORTAL_NOTEBOOK_NETWORK"
            )

    def has_network(self, name: str) -> bool:
        return any(found.name == name for found in self.client.networks.list(names=[name]))

    def remove_network(self, name: str) -> bool:
        try:
            self.client.networks.get(name).remove()
        except NotFound:
            return False
        except DockerException as error:
            raise RuntimeError_(f"removing the Docker network {name} failed: {error}") from None
        return True

    def run_in(self, container_id: str, command: list[str]) -> str:
        """Run a command inside a running container and return what it printed."""
        result = self.client.containers.get(container_id).exec_run(command)
        return bytes(result.output).decode(errors="replace")

    def cpu_by_device(self) -> dict[str, tuple[float, float]]:
        """For each running GPU container, by its device UUID: CPU seconds used so far and its CPU limit.

        The simulated GPU backend follows these (a busy notebook shows a busy GPU).
        """
        usage: dict[str, tuple[float, float]] = {}
        for container in self.client.containers.list(filters=ours(f"{LABEL_PREFIX}.device")):
            try:
                stats = container.stats(stream=False, one_shot=True)
            except (DockerException, NotFound, ValueError):
                # It stopped between the list and the read, or the engine answered an empty body (a container
                # starting or stopping): skip it this second rather than lose every container's reading.
                continue
            used = float(stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0)) / 1e9
            limit = float(container.attrs.get("HostConfig", {}).get("NanoCpus") or 0) / 1e9 or self.host_cpus()
            device = container.labels[f"{LABEL_PREFIX}.device"]
            before = usage.get(device, (0.0, 0.0))  # a shared GPU: its containers add up
            usage[device] = (before[0] + used, before[1] + limit)
        return usage
