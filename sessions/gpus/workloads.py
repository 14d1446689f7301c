"""Workloads: what holds slices (a notebook session, a render job, and whatever kind comes later), each kind
registered once with the verbs the rest of the portal needs, and the gate every allocation for one passes.

A kind says whose a workload is, which are live (starting, running or waiting for slices) and how one is
stopped with a reason (``Reason``); people see it through its ``Holder`` (label, page). Whatever acts on "all
that holds slices" asks here: the zero-balance stop, the staff stop button, culling. The gate is asked by the
allocator before it hands a slice to any workload (a launch, a render probe, a job's further slices, a retry's
slice, a spot hand-over, whatever reconciliation dispatches), and by a kind before it commits to a cost (a
render job's confirmation); billing registers its credit check as the gate at start-up, so sessions never
import billing. The end of a holding is one function for every kind: ``sessions.gpus.holdings.end``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

from django.contrib.auth.models import User
from django.db import models

from sessions.gpus.holders import Holder, HolderKind

if TYPE_CHECKING:
    from sessions.gpus.allocator import SliceRequest


class Reason(models.TextChoices):
    """Why a workload is stopped, as its owner reads it."""

    USER = "user", "Stopped by its owner"
    STAFF = "staff", "Stopped by an operator"
    CREDIT = "credit", "Credit ran out"
    PREEMPTED = "preempted", "Reclaimed for an on-demand launch (spot)"
    IDLE = "idle", "Stopped after being idle"
    MAX_AGE = "max_age", "Reached the maximum age"
    HOST_LOST = "host_lost", "Its GPU host stopped answering"


class Kind(Protocol):
    """One kind of workload, as the rest of the portal acts on it."""

    kind: HolderKind

    def owner_of(self, holder_id: int) -> int | None:
        """Whose it is; None if there is no such workload."""
        ...

    def live(self, owner_id: int | None = None) -> list[int]:
        """The ids of its workloads that start, run or wait for slices (of one person, or everyone's)."""
        ...

    def names(self, holder_ids: list[int]) -> dict[int, str]:
        """What their owners call these (a session's server name, a job's scene file), in one query."""
        ...

    def stop(self, holder_id: int, reason: str, by: User | None) -> None:
        """Stop it for ``reason``: its containers go, its slices are released, its holdings charged to their
        ends. ``by`` is the person asking (None: the portal itself); it answers as its own stop would."""
        ...

    def give_up(self, holder_id: int, slice_id: int, reason: str) -> None:
        """Hand one of its slices back (a spot reclaim): what runs on it stops, the slice is released once its
        container is gone (``sessions.gpus.holdings.end``, which hands it to whoever waits for it), and the
        workload goes on elsewhere if it can."""
        ...


class Gate(Protocol):
    """Whoever bills: may this person take a slice for this workload, or commit to this cost?"""

    def refusal(self, owner: User, request: SliceRequest, holder: Holder) -> str | None:
        """Why a slice of ``request`` may not be allocated to ``holder`` now, in words; None if it may."""
        ...

    def commitment_refusal(self, owner: User, cost: Decimal, what: str) -> str | None:
        """Why ``owner`` may not commit to ``cost`` (``what`` names it, e.g. "this render job's estimate")."""
        ...


class Open:
    """The gate while nothing bills: everything may start."""

    def refusal(self, owner: User, request: SliceRequest, holder: Holder) -> str | None:
        return None

    def commitment_refusal(self, owner: User, cost: Decimal, what: str) -> str | None:
        return None


Releaser = Callable[[int, str], None]
_kinds: dict[str, Kind] = {}
_gate: list[Gate] = [Open()]
_releaser: list[Releaser] = []


def register(kind: Kind) -> None:
    _kinds[kind.kind.value] = kind


def register_gate(gate: Gate) -> None:
    _gate[0] = gate


def register_releaser(releaser: Releaser) -> None:
    """How a slice is given back once a workload's holding of it ended: the allocator's release, or one that
    hands the room to a launch waiting for it (a spot reclaim's) in the same turn; registered at start-up."""
    _releaser[:] = [releaser]


def release(slice_id: int, reason: str) -> None:
    if _releaser:
        _releaser[0](slice_id, reason)
        return
    from sessions.gpus.allocator import release as released  # the allocator imports this module

    released(slice_id, reason=reason)


def gate() -> Gate:
    return _gate[0]


def kinds() -> list[Kind]:
    return list(_kinds.values())


def kind_of(holder: Holder) -> Kind:
    return _kinds[holder.kind.value]


def live(owner_id: int | None = None) -> list[Holder]:
    """Every live workload of every kind (of one person, or everyone's)."""
    return [Holder(kind.kind, holder_id) for kind in kinds() for holder_id in kind.live(owner_id)]


def names(holders: Iterable[Holder]) -> dict[Holder, str]:
    """What their owners call these workloads, of whatever kind: one query per kind."""
    by_kind: dict[str, list[int]] = {}
    for holder in holders:
        by_kind.setdefault(holder.kind.value, []).append(holder.id)
    found: dict[Holder, str] = {}
    for kind, ids in by_kind.items():
        if kind in _kinds:
            found.update({Holder(_kinds[kind].kind, pk): name for pk, name in _kinds[kind].names(ids).items()})
    return found


def stop(holder: Holder, reason: str, by: User | None = None) -> None:
    kind_of(holder).stop(holder.id, reason, by)


def stop_all(holders: Iterable[Holder], reason: str, by: User | None = None) -> int:
    """Stop each; returns how many were asked to stop."""
    count = 0
    for holder in holders:
        stop(holder, reason, by)
        count += 1
    return count
