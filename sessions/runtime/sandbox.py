"""What runs a render sandbox (``sessions.runtime.render``): a Docker engine (``sessions.runtime.docker``) or a
Kubernetes namespace, one Job per run (``sessions.runtime.kube.runs``). Either starts a run, streams its
output, kills it, waits for its end and removes it; ``files_here`` says whether the run's scene and output
folders are this machine's, mounted into it (Docker), or reach it through the file store (Kubernetes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from sessions.runtime.docker import ContainerState
from sessions.runtime.spec import ContainerSpec


class Sandbox(Protocol):
    files_here: bool

    def start(self, spec: ContainerSpec, command: list[str], **overrides: Any) -> str: ...

    def output_lines(self, container_id: str) -> Iterator[str]: ...

    def kill(self, container_id: str) -> bool: ...

    def exit_of(self, container_id: str, timeout: float = 30) -> ContainerState: ...

    def remove(self, container_id: str) -> None: ...

    def within_host(self, spec: ContainerSpec) -> ContainerSpec: ...

    def host_cpus(self) -> int | None: ...

    def containers_for(self, label: str, value: str | None = None) -> list[str]: ...

    def run_briefly(self, image: str, command: list[str], user: str, volumes: dict[str, dict[str, str]]) -> int: ...
