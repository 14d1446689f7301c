"""A person's storage quota and their use of it: the quota read from the admin's overrides or the setting, the
use one sum over ``StorageUse`` rows, which the parts that write files keep up to date (``record``, ``forget``)
and a periodic task measures again (``measure_everything``, the measures each part registers at start-up).

This module knows no render job and no notebook: render and notebooks register their measures here and record
their own rows, so either can ask what a person has left without importing the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Max, QuerySet, Sum
from django.utils import timezone

from sessions.storage.models import GIB, GroupStorageQuota, StorageQuota, StorageUse

log = logging.getLogger(__name__)
Kind = StorageUse.Kind
Measure = Callable[[], int]  # measures one part's things for everyone; returns how many it measured
_measures: list[Measure] = []


def register_measure(measure: Measure) -> None:
    if measure not in _measures:
        _measures.append(measure)


def measure_everything() -> int:
    """Every registered measure, each on its own: one that fails (the Docker engine does not answer) is logged
    and leaves its rows as they were, the others still run."""
    measured = 0
    for measure in list(_measures):
        try:
            measured += measure()
        except Exception:  # one part's failure must not stop the others' figures
            log.exception("measuring storage with %s failed; its figures stay as they were", measure.__qualname__)
    return measured


def limit_of(owner: User) -> int:
    """Their own quota, else the largest of their groups', else PORTAL_STORAGE_QUOTA_BYTES."""
    own = StorageQuota.objects.filter(user=owner).first()
    if own is not None:
        return own.max_bytes
    largest = GroupStorageQuota.objects.filter(group__user=owner).aggregate(most=Max("gib"))["most"]
    return int(largest * GIB) if largest is not None else int(settings.STORAGE_QUOTA_BYTES)


@dataclass(frozen=True)
class Usage:
    """What a person may keep and what they keep, largest first."""

    limit: int
    items: tuple[StorageUse, ...]

    @property
    def used(self) -> int:
        return sum(item.bytes for item in self.items)

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)

    @property
    def full(self) -> bool:
        return self.used >= self.limit

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.used / self.limit)) if self.limit else 100

    def of_kind(self, kind: str) -> int:
        return sum(item.bytes for item in self.items if item.kind == kind)


def usage_of(owner: User) -> Usage:
    items = StorageUse.objects.filter(owner=owner).order_by("-bytes", "kind", "key")
    return Usage(limit_of(owner), tuple(items))


def used_by(owner_id: int) -> int:
    return int(StorageUse.objects.filter(owner_id=owner_id).aggregate(total=Sum("bytes"))["total"] or 0)


def lock(owner: User) -> None:
    """Hold the person's row until the caller's transaction ends: two uploads begun at once are checked one
    after the other, each against what the other reserved (no key lock: rows naming them may still be added)."""
    User.objects.select_for_update(no_key=True).filter(pk=owner.pk).first()


def record(
    owner_id: int,
    kind: str,
    key: str,
    *,
    label: str,
    size: int,
    parts: dict[str, int] | None = None,
    url: str = "",
    at: datetime | None = None,
) -> None:
    """What one thing takes now, replacing what was known of it."""
    StorageUse.objects.update_or_create(
        kind=kind,
        key=key,
        defaults={
            "owner_id": owner_id,
            "label": label[:255],
            "url": url,
            "bytes": max(0, size),
            "parts": parts or {},
            "measured_at": at or timezone.now(),
        },
    )


def forget(kind: str, key: str) -> None:
    """The thing is gone from the disk."""
    StorageUse.objects.filter(kind=kind, key=key).delete()


def forget_all_but(kind: str, keys: Iterable[str] | QuerySet[Any, Any]) -> int:
    """Rows of ``kind`` whose thing is no longer there (a measure found only ``keys``: a list, or a query, which
    is then asked in the same statement, so a thing recorded meanwhile is never forgotten); returns how many."""
    kept = keys if isinstance(keys, QuerySet) else list(keys)
    deleted, _ = StorageUse.objects.filter(kind=kind).exclude(key__in=kept).delete()
    return int(deleted)
