"""Where MIG instances go on one GPU: legality, how much still fits, and the placement rule.

Pure functions over a small value (``Layout``): which memory slices are taken,
how many compute slices are used, how many instances of each profile exist.
The allocator, the simulated backend, the layout form and the benchmark all
use these, so one set of rules holds everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import TypeVar

from sessions.gpus.catalog import GpuModel, Profile

K = TypeVar("K")


@dataclass(frozen=True)
class Layout:
    memory_mask: int = 0
    compute_used: int = 0
    counts: tuple[tuple[str, int], ...] = field(default=())

    def count(self, profile: str) -> int:
        return dict(self.counts).get(profile, 0)

    @property
    def key(self) -> str:
        """A short text naming this layout exactly, e.g. '240:3:3g.71gb=1' (mask:compute:counts)."""
        counts = ",".join(f"{name}={count}" for name, count in self.counts)
        return f"{self.memory_mask}:{self.compute_used}:{counts}"

    @classmethod
    @lru_cache(maxsize=4096)  # layouts repeat across a fleet; Layout is immutable
    def from_key(cls, key: str) -> Layout:
        mask, compute, counts = key.split(":", 2)
        pairs = [item.split("=") for item in counts.split(",") if item]
        return cls(int(mask), int(compute), tuple(sorted((name, int(count)) for name, count in pairs)))

    def with_instance(self, profile: Profile, start: int) -> Layout:
        counts = dict(self.counts)
        counts[profile.name] = counts.get(profile.name, 0) + 1
        return Layout(
            memory_mask=self.memory_mask | profile.mask_at(start),
            compute_used=self.compute_used + profile.compute_slices,
            counts=tuple(sorted(counts.items())),
        )

    def without_instance(self, profile: Profile, start: int) -> Layout:
        counts = dict(self.counts)
        counts[profile.name] -= 1
        if not counts[profile.name]:
            del counts[profile.name]
        return Layout(
            memory_mask=self.memory_mask & ~profile.mask_at(start),
            compute_used=self.compute_used - profile.compute_slices,
            counts=tuple(sorted(counts.items())),
        )


def layout_of(gpu_model: GpuModel, instances: Iterable[tuple[str, int]]) -> Layout:
    """Build a layout from (profile name, start) pairs, checking each is legal."""
    layout = Layout()
    for name, start in instances:
        profile = gpu_model.profile(name)
        problem = why_not(gpu_model, layout, profile, start)
        if problem:
            raise ValueError(problem)
        layout = layout.with_instance(profile, start)
    return layout


def why_not(gpu_model: GpuModel, layout: Layout, profile: Profile, start: int) -> str | None:
    """None if ``profile`` can be placed at ``start``; otherwise the reason, in words."""
    if start not in profile.placements:
        allowed = ", ".join(map(str, profile.placements))
        return f"{profile.name} cannot start at memory slice {start}; it may start at {allowed}."
    if layout.memory_mask & profile.mask_at(start):
        end = start + profile.placement_size - 1
        return f"{profile.name} at {start} needs memory slices {start}-{end}, and some are taken."
    if layout.compute_used + profile.compute_slices > gpu_model.compute_slices:
        free = gpu_model.compute_slices - layout.compute_used
        return f"{profile.name} needs {profile.compute_slices} compute slices; only {free} are free."
    if layout.count(profile.name) >= profile.max_count:
        return f"One {gpu_model.name} holds at most {profile.max_count} × {profile.name}."
    return None


def free_starts(gpu_model: GpuModel, layout: Layout, profile: Profile) -> list[int]:
    return [start for start in profile.placements if why_not(gpu_model, layout, profile, start) is None]


def fit_count(gpu_model: GpuModel, layout: Layout, profile: Profile) -> int:
    """How many more instances of ``profile`` fit, if only that profile were added.

    Exact: one profile's placements are aligned blocks that never overlap each other.
    """
    blocks = sum(1 for start in profile.placements if not layout.memory_mask & profile.mask_at(start))
    by_compute = (gpu_model.compute_slices - layout.compute_used) // profile.compute_slices
    by_count = profile.max_count - layout.count(profile.name)
    return max(0, min(blocks, by_compute, by_count))


def demand_weight(profile: Profile) -> float:
    """How often we expect each profile to be asked for: small slices are the common case.

    Halving with each step up in size; media-extension variants are rarer still.
    This prior only ranks placements; it never refuses a request.
    """
    base = {1: 8.0, 2: 4.0, 3: 2.0, 4: 1.0}.get(profile.compute_slices, 1.0)
    return base / 4 if profile.media_extensions else base


@cache
def _value_function(gpu_model: GpuModel) -> Callable[[Layout], float]:
    weights = [(profile, demand_weight(profile)) for profile in gpu_model.profiles]
    total = sum(weight for _, weight in weights)

    @cache
    def value(layout: Layout) -> float:
        # Expected number of further requests this GPU can still serve, if requests
        # arrive with the demand weights and each is placed as well as possible.
        expected = 0.0
        for profile, weight in weights:
            starts = free_starts(gpu_model, layout, profile)
            if starts:
                best_next = max(value(layout.with_instance(profile, start)) for start in starts)
                expected += weight / total * (1 + best_next)
        return expected

    return value


def value(gpu_model: GpuModel, layout: Layout) -> float:
    """What a layout still offers, in expected future requests served (higher is better)."""
    return _value_function(gpu_model)(layout)


@lru_cache(maxsize=65536)
def best_start(gpu_model: GpuModel, layout: Layout, profile: Profile) -> tuple[int, float] | None:
    """The start that loses the least future value, as (start, value lost); ties go to the highest start."""
    before = value(gpu_model, layout)
    best: tuple[int, float] | None = None
    for start in free_starts(gpu_model, layout, profile):
        lost = before - value(gpu_model, layout.with_instance(profile, start))
        if best is None or lost <= best[1] + 1e-12:
            best = (start, lost)
    return best


def choose(gpu_model: GpuModel, candidates: Sequence[tuple[K, Layout]], profile: Profile) -> tuple[K, int] | None:
    """Our placement rule across GPUs of one model: the fullest GPU where the profile
    fits (keeping emptier GPUs whole for large requests), then the start on it that
    loses the least value. ``candidates`` are (key, layout) pairs; returns (key, start)."""
    best: tuple[float, K, int, int] | None = None
    seen: set[Layout] = set()
    for key, layout in sorted(candidates, key=lambda item: -item[1].compute_used):
        if best is not None and layout.compute_used < best[3]:
            break  # only emptier GPUs remain
        if layout in seen:  # a fleet has many identical layouts (empty GPUs above all)
            continue
        seen.add(layout)
        found = best_start(gpu_model, layout, profile)
        if found is not None and (best is None or found[1] < best[0]):
            best = (found[1], key, found[0], layout.compute_used)
    return None if best is None else (best[1], best[2])


def first_fit(gpu_model: GpuModel, candidates: Sequence[tuple[K, Layout]], profile: Profile) -> tuple[K, int] | None:
    """The baseline rule: the lowest free start on the first GPU with room."""
    for key, layout in candidates:
        starts = free_starts(gpu_model, layout, profile)
        if starts:
            return key, starts[0]
    return None


def capacity(gpu_model: GpuModel, layout: Layout) -> dict[str, int]:
    """How many more of each profile fit right now (each counted alone)."""
    return {profile.name: fit_count(gpu_model, layout, profile) for profile in gpu_model.profiles}
