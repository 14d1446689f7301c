"""The render jobs' containers as Docker sees them: when each one started and ended, and stopping a job's.

Billing charges a slice from its holder's first container start to its last container's end, as the engine
recorded them (``sessions.gpus.holdings``); ``Watched`` hears those moments from the sandbox runner's own
calls, and asks, between a container's create and its start, whether it may still start at all (its job may
have been cancelled meanwhile). Containers are found by the labels every render container carries: its job,
and its chunk where it renders one. On a Kubernetes node (``kube://``) each run is a Job, found and stopped
the same way (``sessions.runtime.kube.runs``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sessions.gpus.models import Slice
from sessions.runtime import engines
from sessions.runtime.docker import ContainerState, DockerRuntime, RuntimeError_
from sessions.runtime.engine_config import KUBE
from sessions.runtime.sandbox import Sandbox
from sessions.runtime.spec import LABEL_PREFIX, ContainerSpec

if TYPE_CHECKING:  # the cluster's client is loaded only where a kube:// host renders
    from sessions.runtime.kube.runs import JobRuntime

log = logging.getLogger(__name__)
JOB_LABEL = "render_job"  # gpu-portal.render_job=<job id>, on every container of the job (probe and chunks)
CHUNK_LABEL = "render_chunk"  # gpu-portal.render_chunk=<chunk id>, on a chunk's container
STOP_WAIT_S = 10


def labels(job_id: int, chunk_id: int | None = None) -> dict[str, str]:
    found = {f"{LABEL_PREFIX}.{JOB_LABEL}": str(job_id)}
    if chunk_id is not None:
        found[f"{LABEL_PREFIX}.{CHUNK_LABEL}"] = str(chunk_id)
    return found


def _attrs(runtime: DockerRuntime, container_id: str) -> dict[str, Any] | None:
    try:
        return dict(runtime.client.containers.get(container_id).attrs)
    except Exception as error:  # the SDK's NotFound among them; only sessions.runtime may import it
        log.info("container %s: no state (%s)", container_id[:12], error)
        return None


def inspect(runtime: DockerRuntime | JobRuntime, container_id: str) -> ContainerState | None:
    """A container's state as the engine has it (a run's Blender's, on Kubernetes); None once it is gone (or
    the engine will not say)."""
    if not isinstance(runtime, DockerRuntime):
        return runtime.state(container_id)
    attrs = _attrs(runtime, container_id)
    return ContainerState.of(attrs) if attrs is not None else None


def job_of(runtime: DockerRuntime | JobRuntime, container_id: str) -> int | None:
    """The render job a container (a run) belongs to, from its label."""
    if not isinstance(runtime, DockerRuntime):
        labels = runtime.labels_of(container_id)
    else:
        labels = ((_attrs(runtime, container_id) or {}).get("Config") or {}).get("Labels") or {}
    value = labels.get(f"{LABEL_PREFIX}.{JOB_LABEL}", "")
    return int(value) if str(value).isdigit() else None


class NotStarted(RuntimeError_):
    """The container was created but not started: what it was for ended meanwhile (``Watched.may_start``)."""


class Watched(DockerRuntime):
    """The Docker adapter, noting the start and end of the container it runs (one per instance) as the engine
    recorded them, and telling ``on_started`` the start at once: the meter charges from that moment.
    ``may_start`` is asked once the container is created: False, it is removed unstarted (NotStarted)."""

    def __init__(
        self,
        endpoint: str = "",
        on_started: Callable[[datetime | None], None] | None = None,
        may_start: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(endpoint or None)  # the engine of the slice's host (``sessions.runtime.engines``)
        self.on_started = on_started
        self.may_start = may_start
        self.container_id: str | None = None
        self.started_at: datetime | None = None
        self.ended: ContainerState | None = None

    def start(self, spec: ContainerSpec, command: list[str], **overrides: Any) -> str:
        container_id = self.create(spec, command, **overrides)
        self.container_id = container_id
        if self.may_start is not None and not self.may_start():
            self.remove(container_id)
            raise NotStarted("not started: what it was for ended meanwhile")
        self.start_created(container_id, spec.image)
        state = inspect(self, container_id)
        self.started_at = state.started_at if state is not None else None
        try:
            if self.on_started is not None:
                self.on_started(self.started_at)
        except Exception:  # never a container running that nobody follows
            self.remove(container_id)
            raise
        return container_id

    def exit_of(self, container_id: str, timeout: float = 30) -> ContainerState:
        self.ended = super().exit_of(container_id, timeout)
        return self.ended

    @property
    def finished_at(self) -> datetime | None:
        return self.ended.finished_at if self.ended is not None else None


def runtime_at(endpoint: str) -> DockerRuntime | JobRuntime:
    """What runs render work at an engine's endpoint: a Docker engine, or a Kubernetes namespace (``kube://``),
    whose runs are Jobs (``sessions.runtime.kube.runs``)."""
    if endpoint.startswith(KUBE):
        from sessions.runtime.kube.runs import JobRuntime  # the cluster's client: loaded only where it is used

        return JobRuntime(endpoint)
    return engines.at(endpoint)


def of_slice(taken: Slice | None) -> DockerRuntime | JobRuntime:
    """What runs render work on a slice's host (this machine's engine for none)."""
    return runtime_at(engines.endpoint_of(taken.gpu.host.name) if taken is not None else engines.LOCAL)


def of_job(runtime: Sandbox, job_id: int) -> list[str]:
    return runtime.containers_for(JOB_LABEL, str(job_id))


def of_chunk(runtime: Sandbox, chunk_id: int) -> list[str]:
    return runtime.containers_for(CHUNK_LABEL, str(chunk_id))


def stop(runtime: Sandbox, container_ids: list[str]) -> datetime | None:
    """Kill the containers at once and wait for the engine to record their end; the latest end moment.
    The sandbox runner that started each one removes it."""
    ends: list[datetime] = []
    for container_id in container_ids:
        try:
            runtime.kill(container_id)
            state = runtime.exit_of(container_id, timeout=STOP_WAIT_S)
        except RuntimeError_ as error:  # gone already: its runner removed it
            log.info("container %s: %s", container_id[:12], error)
            continue
        if state.finished_at is not None:
            ends.append(state.finished_at)
    return max(ends, default=None)
