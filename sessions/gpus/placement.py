"""Where MIG instances go on one GPU: legality, how much still fits, and the placement rule.

Pure functions over a small value (``Layout``): which memory slices are taken,
how many compute slices are used, how many instances of each profile exist.
The allocator, the simulated backend, the layout form and the benchmark all
use these, so one set of rules holds everywhere. The placement rule weighs
layouts by a ``Demand`` (how often each profile is asked for), learned from
requests with a prior as the start (``learned``; ``demand.py`` reads it).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache
from typing import TypeVar

from sessions.gpus.catalog import GpuModel, Profile

K = TypeVar("K")


def _without_hash(state: dict[str, object]) -> dict[str, object]:
    # A copy or a pickle must not carry a cached hash: a str hashes differently in another process.
    return {name: item for name, item in state.items() if name != "_hash"}


@dataclass(frozen=True)
class Layout:
    memory_mask: int = 0
    compute_used: int = 0
    counts: tuple[tuple[str, int], ...] = field(default=())

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        # Every placement question is looked up by its layout: hash the fields once, not on each lookup.
        return hash((self.memory_mask, self.compute_used, self.counts))

    def __getstate__(self) -> dict[str, object]:
        return _without_hash(self.__dict__)

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
    """How often we expect each profile to be asked for before anything is known: small slices are the common case.

    Halving with each step up in size; media-extension variants are rarer still.
    This prior only ranks placements; it never refuses a request. What people
    actually ask for replaces it as requests are seen (``learned``).
    """
    base = {1: 8.0, 2: 4.0, 3: 2.0, 4: 1.0}.get(profile.compute_slices, 1.0)
    return base / 4 if profile.media_extensions else base


DEMAND_STEPS = 200  # weights in steps of 0.5 %: a demand that drifts by less keeps its cached tables
PRIOR_REQUESTS = 24  # the prior counts as this many requests already seen: a couple of dozen launches outweigh it
# Requests of a model seen before its learned demand is trusted over first-fit. Before that the demand is mostly
# the prior, a guess: on a mix unlike it (mostly 2g and 3g, say) the value rule under the prior places worse than
# first-fit, which assumes nothing. As many as the prior weighs: from then on the seen requests weigh at least as
# much as the guess.
TRUSTED_REQUESTS = PRIOR_REQUESTS
# The demand is learned from a model's last this many requests (within demand.WINDOW), so a mix that changes is
# followed within a couple of hundred launches instead of the weeks a long history would take to outweigh.
RECENT_REQUESTS = 200


@dataclass(frozen=True)
class Demand:
    """How often each profile of one GPU model is asked for: (profile, weight) pairs, weights in
    steps of 1/DEMAND_STEPS. Immutable, hashable and rounded, so value tables are cached per
    demand and a demand that drifts by less than a step keeps its table."""

    weights: tuple[tuple[str, int], ...]

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        # Every cached placement question is keyed by its demand: hash the weights once, not on each lookup.
        return hash(self.weights)

    def __getstate__(self) -> dict[str, object]:
        return _without_hash(self.__dict__)

    @classmethod
    def of(cls, weights: Mapping[str, float]) -> Demand:
        total = sum(weight for weight in weights.values() if weight > 0)
        if total <= 0:
            raise ValueError("A demand needs a positive weight on at least one profile.")
        steps = {name: round(DEMAND_STEPS * weight / total) for name, weight in weights.items() if weight > 0}
        return cls(tuple(sorted((name, step) for name, step in steps.items() if step)))

    def share(self, profile: str) -> float:
        """The part of all requests that ask for ``profile`` (0 for a profile it does not name)."""
        total = sum(step for _, step in self.weights)
        return dict(self.weights).get(profile, 0) / total


@cache
def prior(gpu_model: GpuModel) -> Demand:
    """The demand assumed before any request is seen: ``demand_weight`` for each profile."""
    return Demand.of({profile.name: demand_weight(profile) for profile in gpu_model.profiles})


def learned(gpu_model: GpuModel, requested: Mapping[str, int], prior_requests: float = PRIOR_REQUESTS) -> Demand:
    """The demand after seeing ``requested`` (how many requests asked for each profile).

    The prior counts as ``prior_requests`` requests already seen, so a few requests
    move the demand a little and many move it all the way; with none it is the prior.
    Profiles the model does not have are ignored.
    """
    names = {profile.name for profile in gpu_model.profiles}
    seen = {name: count for name, count in requested.items() if name in names and count > 0}
    if not seen:
        return prior(gpu_model)
    start = {profile.name: demand_weight(profile) for profile in gpu_model.profiles}
    total = sum(start.values())
    return Demand.of({name: prior_requests * weight / total + seen.get(name, 0) for name, weight in start.items()})


@dataclass(frozen=True)
class _Moves:
    """Every layout a GPU model can reach from empty, emptiest first, and where each profile can take it."""

    layouts: tuple[Layout, ...]
    index: dict[Layout, int]
    # per layout, per profile (by position in the model's profiles): the layouts one placement leads to
    after: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]


@cache
def _moves(gpu_model: GpuModel) -> _Moves:
    # Breadth first: a layout's depth is its number of instances, so every layout
    # comes before the layouts it leads to.
    layouts, index = [Layout()], {Layout(): 0}
    after: list[tuple[tuple[int, tuple[int, ...]], ...]] = []
    for layout in layouts:  # grows while we walk it
        moves = []
        for position, profile in enumerate(gpu_model.profiles):
            children = []
            for start in free_starts(gpu_model, layout, profile):
                child = layout.with_instance(profile, start)
                if child not in index:
                    index[child] = len(layouts)
                    layouts.append(child)
                children.append(index[child])
            if children:
                moves.append((position, tuple(dict.fromkeys(children))))
        after.append(tuple(moves))
    return _Moves(tuple(layouts), index, tuple(after))


@lru_cache(maxsize=64)  # a few models times the demands of the last while; each table is ~1,100 floats
def _values(gpu_model: GpuModel, demand: Demand) -> tuple[float, ...]:
    # Expected number of further requests a layout can still serve, if requests arrive
    # with this demand and each is placed as well as possible (computed fullest first).
    moves = _moves(gpu_model)
    shares = [demand.share(profile.name) for profile in gpu_model.profiles]
    if not any(shares):
        raise ValueError(f"This demand asks for no profile of {gpu_model.name}: {demand}.")
    values = [0.0] * len(moves.layouts)
    for number in range(len(values) - 1, -1, -1):
        expected = 0.0
        for position, children in moves.after[number]:
            share = shares[position]
            if share:
                expected += share * (1 + max(values[child] for child in children))
        values[number] = expected
    return tuple(values)


def value(gpu_model: GpuModel, layout: Layout, demand: Demand | None = None) -> float:
    """What a layout still offers, in expected future requests served (higher is better)."""
    demand = demand or prior(gpu_model)
    number = _moves(gpu_model).index.get(layout)
    if number is not None:
        return _values(gpu_model, demand)[number]
    return _value_off_table(gpu_model, layout, demand)


@lru_cache(maxsize=4096)  # off-table layouts are rare; their children are off the table too
def _value_off_table(gpu_model: GpuModel, layout: Layout, demand: Demand) -> float:
    # A layout no sequence of legal placements reaches (bookkeeping a driver disagrees with): the same sum, by hand.
    expected = 0.0
    for profile in gpu_model.profiles:
        starts = free_starts(gpu_model, layout, profile)
        share = demand.share(profile.name)
        if starts and share:
            expected += share * (1 + max(value(gpu_model, layout.with_instance(profile, s), demand) for s in starts))
    return expected


def best_start(
    gpu_model: GpuModel, layout: Layout, profile: Profile, demand: Demand | None = None
) -> tuple[int, float] | None:
    """The start that loses the least future value, as (start, value lost); ties go to the highest start."""
    demand = demand or prior(gpu_model)
    return _best_start(_best_starts(gpu_model, profile, demand), gpu_model, layout, profile, demand)


_UNSEEN = (-1, 0.0)  # no layout's answer: a start is never negative
MEMO_LAYOUTS = 8192  # a model reaches ~1,100 layouts: more are off-table ones piling up, so start again


@lru_cache(maxsize=64)  # models times profiles for this minute's demands; at most ~1,100 layouts each
def _best_starts(gpu_model: GpuModel, profile: Profile, demand: Demand) -> dict[Layout, tuple[int, float] | None]:
    # Answers by layout, filled as layouts are asked about: choose looks each candidate up in
    # this one dict instead of hashing (model, layout, profile, demand) for each.
    return {}


def _best_start(
    memo: dict[Layout, tuple[int, float] | None], gpu_model: GpuModel, layout: Layout, profile: Profile, demand: Demand
) -> tuple[int, float] | None:
    found = memo.get(layout, _UNSEEN)
    if found is not _UNSEEN:
        return found
    before = value(gpu_model, layout, demand)
    found = None
    for start in free_starts(gpu_model, layout, profile):
        lost = before - value(gpu_model, layout.with_instance(profile, start), demand)
        if found is None or lost <= found[1] + 1e-12:
            found = (start, lost)
    if len(memo) >= MEMO_LAYOUTS:
        memo.clear()
    memo[layout] = found
    return found


def choose(
    gpu_model: GpuModel,
    candidates: Sequence[tuple[K, Layout]],
    profile: Profile,
    demand: Demand | None = None,
) -> tuple[K, int] | None:
    """Our placement rule across GPUs of one model: the fullest GPU where the profile
    fits (keeping emptier GPUs whole for large requests), then the start on it that
    loses the least value under ``demand`` (the prior if None); ties go to the earlier
    candidate. ``candidates`` are (key, layout) pairs; returns (key, start)."""
    demand = demand or prior(gpu_model)
    memo = _best_starts(gpu_model, profile, demand)
    best: tuple[int, float, K, int] | None = None  # (compute used, value lost, key, start)
    for key, layout in candidates:
        if best is not None and layout.compute_used < best[0]:
            continue  # an emptier GPU than one that takes it: keep it whole
        found = memo.get(layout, _UNSEEN)
        if found is _UNSEEN:
            found = _best_start(memo, gpu_model, layout, profile, demand)
        if found is not None and (best is None or layout.compute_used > best[0] or found[1] < best[1]):
            best = (layout.compute_used, found[1], key, found[0])
    return None if best is None else (best[2], best[3])


class Recent:
    """The last ``RECENT_REQUESTS`` requests' profiles, counted (``counts``), as ``demand.requested`` reads them
    from the slices given: what a benchmark or a test feeds ``by_history`` as requests come."""

    def __init__(self, names: Iterable[str] = (), keep: int = RECENT_REQUESTS) -> None:
        self.names: deque[str] = deque(maxlen=keep)
        self.counts: Counter[str] = Counter()
        for name in names:
            self.add(name)

    def add(self, name: str) -> None:
        if len(self.names) == self.names.maxlen:
            self.counts[self.names[0]] -= 1
        self.names.append(name)
        self.counts[name] += 1


def trusted(requested: Mapping[str, int]) -> bool:
    """Whether enough requests were seen to place by their demand rather than first-fit."""
    return sum(count for count in requested.values() if count > 0) >= TRUSTED_REQUESTS


def by_history(
    gpu_model: GpuModel, candidates: Sequence[tuple[K, Layout]], profile: Profile, requested: Mapping[str, int]
) -> tuple[K, int] | None:
    """The portal's rule, given what was asked of this model so far (``requested``: count per profile):
    first-fit until the requests are ``trusted``, then ``choose`` under the demand learned from them. So a new
    portal, a new GPU model or a history too thin to know places no worse than first-fit from its first
    request. (The allocator reads the same decision through ``sessions.gpus.demand``, kept per process.)"""
    if not trusted(requested):
        return first_fit(gpu_model, candidates, profile)
    return choose(gpu_model, candidates, profile, learned(gpu_model, requested))


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
