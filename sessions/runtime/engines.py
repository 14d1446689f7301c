"""Which Docker engine runs a GPU host's containers: a runtime per host, looked up by host (issue 31).

``PORTAL_DOCKER_ENGINES`` names the engine of each host that is not this machine's, as
``host=endpoint; host=endpoint`` (``unix:///path``, ``tcp://address:port`` or ``ssh://user@address``); every
other host's containers run on the local engine (``DOCKER_HOST``, else its socket). Reconciliation follows each
engine on its own (``sessions.notebooks.reconcile``), so an engine that does not answer stops nothing on the
others; the container-side work of a slice (a stop, a died-at) goes to its host's engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

from sessions.gpus.models import Slice
from sessions.runtime.docker import DockerRuntime

LOCAL = ""  # the local engine's endpoint: DOCKER_HOST, else the default socket


def endpoint_of(host: str) -> str:
    return str(settings.DOCKER_ENGINES.get(host, LOCAL))


def at(endpoint: str) -> DockerRuntime:
    """The runtime of one engine (not yet asked anything: the first call finds out whether it answers)."""
    return DockerRuntime(endpoint or None)


def for_host(host: str) -> DockerRuntime:
    return at(endpoint_of(host))


def for_slice(taken: Slice) -> DockerRuntime:
    return for_host(taken.gpu.host.name)


def endpoints_for(slices: Iterable[Slice]) -> list[str]:
    """The engines of the slices' hosts, and this machine's (a container may have outlived its slice's row)."""
    return sorted({LOCAL, *(endpoint_of(taken.gpu.host.name) for taken in slices)})


def by_engine(hosts: Iterable[str]) -> dict[str, list[str]]:
    """The hosts grouped by the engine that runs their containers; the local engine always among them."""
    grouped: dict[str, list[str]] = {LOCAL: []}
    for host in sorted(set(hosts)):
        grouped.setdefault(endpoint_of(host), []).append(host)
    return grouped
