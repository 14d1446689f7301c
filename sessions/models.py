"""Models of the sessions app, defined by capability in sub-packages."""

from sessions.gpus.models import Gpu, GpuHost, GpuInstance, HostOrder, SimulatedGpuInstance, Slice, SliceQuota
from sessions.metrics.models import GpuMinute
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.storage.models import GroupStorageQuota, StorageQuota, StorageUse

__all__ = [
    "Gpu",
    "GpuHost",
    "GpuInstance",
    "GpuMinute",
    "GroupStorageQuota",
    "HostOrder",
    "NotebookImage",
    "NotebookSession",
    "RenderChunk",
    "RenderFrame",
    "RenderJob",
    "SimulatedGpuInstance",
    "Slice",
    "SliceQuota",
    "StorageQuota",
    "StorageUse",
]
