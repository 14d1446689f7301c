"""Which GPU hosts this process is the agent of: only a host's agent changes its GPUs (issue 31).

A host's agent (``manage.py gpu_agent`` on that machine) is the one process that creates and destroys its MIG
instances and applies its layouts, carrying out the orders other processes record (``sessions.gpus.orders``).
The backends ask here before any change (``require``) and refuse one asked for by any other process: a web
process or a worker never changes a GPU through its own driver, and the simulated backend, whose "driver
state" every process could write, keeps the same rule. ``manage.py sync_gpus``, run by hand on the host,
acts as its agent for one discovery; the test suite's process acts as the agent of the simulated hosts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.conf import settings

from sessions.gpus.backends.base import BackendError

EVERY_HOST = "*"  # the test suite's process: the agent of every (simulated) host it makes
_lock = threading.Lock()
_hosts: dict[str, int] = {}  # host name -> how many holders of the role (nested acting_for)


def act_for(names: Iterable[str]) -> None:
    """From now on this process is the agent of these hosts (process-wide: every thread of an agent acts)."""
    with _lock:
        for name in names:
            _hosts[name] = _hosts.get(name, 0) + 1


def stop_acting_for(names: Iterable[str]) -> None:
    with _lock:
        for name in names:
            if _hosts.get(name, 0) <= 1:
                _hosts.pop(name, None)
            else:
                _hosts[name] -= 1


@contextmanager
def acting_for(names: Iterable[str]) -> Iterator[None]:
    names = list(names)
    act_for(names)
    try:
        yield
    finally:
        stop_acting_for(names)


def is_agent_of(host: str) -> bool:
    return host in _hosts or EVERY_HOST in _hosts


def hosts() -> list[str]:
    with _lock:
        return sorted(_hosts)


def hosts_of_this_machine() -> list[str]:
    """The hosts an agent on this machine speaks for: PORTAL_GPU_HOST_NAME with NVIDIA's driver, or the hosts of
    the simulated fleet it simulates (PORTAL_SIMULATED_HOSTS; all of them by default: one agent stands in for
    them all)."""
    from sessions.gpus.backends import get_backend
    from sessions.gpus.backends.simulated import parse_fleet

    if get_backend().name == "nvml":
        return [str(settings.GPU_HOST_NAME)]
    fleet = {gpu.host for gpu in parse_fleet(settings.SIMULATED_FLEET)}
    return sorted(fleet & set(settings.SIMULATED_HOSTS) if settings.SIMULATED_HOSTS else fleet)


def require(host: str, change: str) -> None:
    """Refuse ``change`` to ``host``'s GPUs unless this process is its agent."""
    if not is_agent_of(host):
        raise BackendError(
            f"only the agent of host {host} changes its GPUs; this process is not it ({change} refused)",
            code="not_agent",
        )
