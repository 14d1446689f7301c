"""What a render job will take and cost, from what its probe measured: the one rule the estimate follows.

Pure (no Django). A job's frames are cut into chunks; each chunk is one container run, which costs the
probe's per-run overhead (the container's and Blender's start, reading the file, loading the kernels) once,
plus its frames at the probe's time per frame. The job's slices take the waiting chunks one after another,
each the next one as it comes free, so the plan hands each chunk to the slice that is free first. A slice is
held from its first container's start to its last one's end and billed each started minute of that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROBE_FRAMES = 3


def probe_frames(frames: list[int]) -> tuple[int, ...]:
    """The frames the probe renders: the job's first, middle and last (an animation's frames differ)."""
    picked = {frames[0], frames[(len(frames) - 1) // 2], frames[-1]} if frames else set()
    return tuple(sorted(picked))[:PROBE_FRAMES]


@dataclass(frozen=True)
class Plan:
    """How long each of the job's slices would be held (seconds), and in how many chunks."""

    chunks: int
    held_s: tuple[float, ...]

    @property
    def slices(self) -> int:
        return len(self.held_s)

    @property
    def total_seconds(self) -> float:
        """From the first chunk's start to the last one's end: the slowest slice's holding."""
        return max(self.held_s, default=0.0)

    @property
    def minutes(self) -> int:
        """The minutes billed: each started minute of each slice's holding."""
        return sum(max(1, math.ceil(held / 60)) for held in self.held_s)


def chunk_sizes(frames: int, chunk_size: int) -> list[int]:
    """Frames per chunk, in order: ``chunk_size`` each, the last one what is left."""
    size = max(1, chunk_size)
    return [min(size, frames - start) for start in range(0, frames, size)]


def slices_for(frames: int, chunk_size: int, max_slices: int) -> int:
    """How many slices the job would hold at once: one per chunk, at most ``max_slices``."""
    return max(1, min(max_slices, len(chunk_sizes(frames, chunk_size))))


@dataclass(frozen=True)
class Sharing:
    """How much slower each of the job's slices renders because they share the host's cores: Cycles on the
    CPU (a simulated GPU) samples on every thread of the container's CPUs, and slices whose threads together
    pass the host's cores take turns; the rest of a frame (syncing the scene, saving) and of a run (starting
    the container and Blender) runs mostly on one core each. On a GPU each slice renders on its own."""

    sampling: float = 1.0
    serial: float = 1.0

    def frame(self, seconds: float, sampling: float) -> float:
        """A frame of ``seconds``, ``sampling`` of them spent sampling, on a shared host."""
        return (seconds - sampling) * self.serial + sampling * self.sampling


def sharing(slices: int, threads: int, host_cpus: int, on_cpu: bool) -> Sharing:
    if not on_cpu or host_cpus <= 0:
        return Sharing()
    return Sharing(max(1.0, slices * max(1, threads) / host_cpus), max(1.0, slices / host_cpus))


def plan(frames: int, chunk_size: int, max_slices: int, per_frame_s: float, per_chunk_s: float) -> Plan:
    """Hand the job's chunks, in order, each to the slice free first (as the slices' workers take them)."""
    sizes = chunk_sizes(frames, chunk_size)
    held = [0.0] * slices_for(frames, chunk_size, max_slices)
    for size in sizes:
        free_first = held.index(min(held))
        held[free_first] += per_chunk_s + size * per_frame_s
    return Plan(len(sizes), tuple(round(seconds, 3) for seconds in held))
