"""The seam through which whoever bills launches prices the offers (who may start what is the workloads' gate,
sessions/gpus/workloads.py).

Sessions never import billing (billing imports sessions); billing's AppConfig.ready registers its
``Pricing`` here. Without one registered, launches are free and never refused for money, and the
form says prices are not set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Slice


@dataclass(frozen=True)
class OfferPrice:
    """What one offer costs, in words ready to show: per hour on-demand and spot, and how long the
    person's balance lasts at each rate (empty where unknown)."""

    per_hour: str
    spot_per_hour: str = ""
    covers: str = ""
    spot_covers: str = ""


@dataclass(frozen=True)
class WalletLine:
    """The person's money as the launch form shows it."""

    balance: str
    note: str = ""


class Pricing(Protocol):
    def prices(self, owner: User, requests: Sequence[SliceRequest]) -> dict[SliceRequest, OfferPrice]: ...

    def wallet(self, owner: User) -> WalletLine | None: ...

    def per_minute(self, request: SliceRequest, market: str) -> Decimal | None:
        """What a started minute of this offer costs now, on this market; None where it has no price
        (render jobs' estimates and their cost so far)."""
        ...

    def costs_so_far(self, holdings: Sequence[Slice]) -> dict[int, Decimal]:
        """What each begun holding (by slice id, its GPU loaded) has cost so far: each started minute at the
        rate the meter freezes on it, by the database's clock, as the meter charges it. Holdings no price
        covers are left out."""
        ...


class Unpriced:
    def prices(self, owner: User, requests: Sequence[SliceRequest]) -> dict[SliceRequest, OfferPrice]:
        return {}

    def wallet(self, owner: User) -> WalletLine | None:
        return None

    def per_minute(self, request: SliceRequest, market: str) -> Decimal | None:
        return None

    def costs_so_far(self, holdings: Sequence[Slice]) -> dict[int, Decimal]:
        return {}


_registered: list[Pricing] = [Unpriced()]


def register(pricing: Pricing) -> None:
    _registered[0] = pricing


def current() -> Pricing:
    return _registered[0]
