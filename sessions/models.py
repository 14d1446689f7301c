"""Models of the sessions app, defined by capability in sub-packages."""

from sessions.gpus.models import Gpu, GpuHost, GpuInstance, SimulatedGpuInstance, Slice, SliceQuota

__all__ = ["Gpu", "GpuHost", "GpuInstance", "SimulatedGpuInstance", "Slice", "SliceQuota"]
