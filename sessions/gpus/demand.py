"""What people ask for on each GPU model: the demand the placement rule weighs layouts by.

Learned from the profiles of the last ``placement.RECENT_REQUESTS`` MIG slices allocated in the last ``WINDOW``,
with the prior as the start (``placement.learned``), and kept in this process
for ``REFRESH_SECONDS`` so a launch does not pay a query.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.db.models import Count, Subquery
from django.utils import timezone

from sessions.gpus import catalog, placement
from sessions.gpus.models import Slice
from sessions.gpus.placement import Demand

WINDOW = timedelta(days=14)  # long enough for a quiet model to have a mix, short enough to follow a change
REFRESH_SECONDS = 60.0
THIN_REFRESH_SECONDS = 2.0  # a history too thin to trust is read again soon: a new portal learns within seconds

_kept: dict[str, tuple[float, Demand | None]] = {}  # model name -> (monotonic moment it goes stale, demand)


def for_model(model_name: str) -> Demand | None:
    """The demand for a catalog model's MIG profiles as recently seen, or None while too few requests were seen
    to trust it (``placement.trusted``: place first-fit). Kept ``REFRESH_SECONDS`` (a thin history, only
    ``THIN_REFRESH_SECONDS``)."""
    now = time.monotonic()
    kept = _kept.get(model_name)
    if kept is not None and now < kept[0]:
        return kept[1]
    seen = requested(model_name)
    demand = placement.learned(catalog.model(model_name), seen) if placement.trusted(seen) else None
    _kept[model_name] = (now + (REFRESH_SECONDS if demand else THIN_REFRESH_SECONDS), demand)
    return demand


def requested(model_name: str, since: datetime | None = None) -> dict[str, int]:
    """How many of this model's last ``placement.RECENT_REQUESTS`` MIG slices, allocated since ``since``
    (default: a window ago), were of each profile.

    Released slices count as much as held ones: they were asked for all the same.
    """
    since = since or timezone.now() - WINDOW
    mig = Slice.objects.filter(kind=Slice.Kind.MIG, gpu__model_name=model_name, allocated_at__gte=since)
    recent = mig.order_by("-allocated_at", "-id").values("id")[: placement.RECENT_REQUESTS]
    rows = Slice.objects.filter(id__in=Subquery(recent)).values_list("profile").annotate(count=Count("id")).order_by()
    return dict(rows)


def forget() -> None:
    """Drop what this process keeps, so the next call for each model reads the slices again."""
    _kept.clear()
