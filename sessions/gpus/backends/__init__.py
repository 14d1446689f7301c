"""GPU backends behind one interface; ``get_backend()`` picks the one this host uses.

PORTAL_GPU_BACKEND: ``auto`` (NVML if an NVIDIA driver answers, else
simulated), ``nvml`` or ``simulated``.
"""

from __future__ import annotations

import logging
from functools import cache

from django.conf import settings

from sessions.gpus.backends.base import BackendError, GpuBackend
from sessions.gpus.backends.simulated import SimulatedBackend

log = logging.getLogger(__name__)

__all__ = ["BackendError", "GpuBackend", "backend_for_host", "get_backend"]


@cache
def get_backend() -> GpuBackend:
    choice = settings.GPU_BACKEND
    if choice in {"auto", "nvml"}:
        from sessions.gpus.backends.nvml import NvmlBackend, nvml_available

        if nvml_available():
            return NvmlBackend(settings.GPU_HOST_NAME)
        if choice == "nvml":
            raise BackendError("PORTAL_GPU_BACKEND is nvml, but no NVIDIA driver answers on this host.", code="driver")
        log.info("no NVIDIA driver answers; using the simulated GPU fleet")
    return SimulatedBackend(settings.SIMULATED_FLEET, hosts=settings.SIMULATED_HOSTS)


def backend_for_host(backend_name: str) -> GpuBackend:
    """The backend that manages a host recorded with ``backend_name`` (only this host's, for now)."""
    backend = get_backend()
    if backend.name != backend_name:
        raise BackendError(
            f"this process runs the {backend.name} backend and cannot manage a {backend_name} host", code="wrong_host"
        )
    return backend
