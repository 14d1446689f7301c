"""Taking turns: requests for the same pool (MIG GPUs of one model, whole GPUs, time-sliced GPUs) wait on a
transaction-long advisory lock per pool (PostgreSQL; SQLite runs one writing transaction at a time anyway),
taken in the keys' order so requests needing several pools never wait on each other in a circle."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import connection

from sessions.gpus import catalog, statements
from sessions.gpus.models import Slice
from sessions.gpus.requests import SliceRequest, checked


def hold_every_pool() -> None:
    """Wait for every allocation in flight and keep new ones waiting until the caller's transaction ends
    (fleet discovery compares the driver's instances with the rows at one moment)."""
    if connection.vendor == "postgresql":
        statements.run(turn([Slice.Kind.WHOLE, Slice.Kind.SHARED, *mig_pools()]))


def take_turn(request: SliceRequest) -> None:
    """Wait for this request's pools' turn and keep it until the caller's transaction ends.

    For a release that hands its room straight to a waiting request (a reclaimed spot slice): the turn
    first, then the release's GPU row lock, the order every allocation takes them in, so neither waits
    for the other in a circle, and no request in between can take the room.
    """
    if connection.vendor == "postgresql":
        statements.run(turn(pools(checked(request))))


def pools(request: SliceRequest) -> list[str]:
    if request.kind != Slice.Kind.MIG:
        return [request.kind]
    return [f"mig:{request.model}"] if request.model else mig_pools()


def mig_pools() -> list[str]:
    return [f"mig:{model.name}" for model in catalog.models().values() if model.profiles]


def turn(pools: Sequence[str]) -> tuple[str, list[Any]]:
    """The statement that waits for these pools' turns, in the keys' order (no two requests wait in a circle)."""
    keys = sorted(lock_key(pool) for pool in pools)
    return "SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k", [keys]


@cache
def lock_key(pool: str) -> int:
    """A stable 64-bit advisory-lock key for an allocation pool."""
    digest = hashlib.sha256(f"gpu-portal:allocate:{pool}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
