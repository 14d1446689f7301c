"""Models of the sessions app, defined by capability in sub-packages."""

from sessions.gpus.models import Gpu, GpuHost, GpuInstance, SimulatedGpuInstance, Slice, SliceQuota
from sessions.metrics.models import GpuMinute
from sessions.notebooks.models import NotebookImage, NotebookSession

__all__ = [
    "Gpu",
    "GpuHost",
    "GpuInstance",
    "GpuMinute",
    "NotebookImage",
    "NotebookSession",
    "SimulatedGpuInstance",
    "Slice",
    "SliceQuota",
]
