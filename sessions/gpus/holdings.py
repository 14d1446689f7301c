"""A slice's holding: when its holder's container started and was gone (the engine's moments), and the
last proof that it was running; the one way any holding ends.

The billing meter reads these columns and nothing else, so every kind of workload is billed the same way:
an open holding up to its last proof of life (``Slice.seen_at``), an ended one to its end. A proof of life is
stamped by whoever watches the container (reconciliation's look at the engine, the render worker following
its chunk) with the database's clock, read before the look, so it never lies ahead of the container's end.
A holding nobody can confirm (engine unreachable, worker dead) is thus not charged past its last proof until
someone confirms it again, and one whose end the engine cannot tell ends at that proof.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Greatest

from portal.celery import send_on_commit
from portal.clock import database_now
from sessions.gpus import workloads
from sessions.gpus.models import GpuHost, Slice

# Billing's task that charges a holding to its end (billing.tasks registers it under this name): billing may
# import sessions, never the reverse, so it is enqueued by name.
CHARGE_HOLDING = "billing.tasks.charge_holding"


def started(slice_id: int, at: datetime | None) -> None:
    """Record when the slice's holder began running on it (its container's start); the first moment stands.
    The start is its first proof of life."""
    if at is None:
        return
    Slice.objects.filter(pk=slice_id, held_from__isnull=True).update(
        held_from=at, seen_at=Greatest(Coalesce("seen_at", at), at)
    )


def seen(slice_ids: Iterable[int], at: datetime | None = None) -> int:
    """A proof of life: the holders' containers ran at ``at`` (default: the database's now, which the caller
    reads before it looks, never after). Only begun, unended holdings move, and never back; none on a lost host
    (``sessions.gpus.hosts``: nothing there is charged past its last heartbeat). Returns how many."""
    ids = list(slice_ids)
    if not ids:
        return 0
    moment = at if at is not None else database_now()
    running = Q(pk__in=ids, held_from__isnull=False, held_until__isnull=True, released_at__isnull=True)
    running &= ~Q(gpu__host__state=GpuHost.State.LOST)
    return Slice.objects.filter(running).update(seen_at=Greatest(Coalesce("seen_at", F("held_from")), moment))


class Heartbeat:
    """Proofs of life from whoever follows a holder's container as it runs (the render worker reading its
    output, say): called as often as the container shows it is alive, it stamps one every ``every`` seconds."""

    def __init__(self, slice_id: int, every: float = 10.0) -> None:
        self.slice_id, self.every, self._last = slice_id, every, 0.0

    def __call__(self, *_: object) -> None:
        if time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            seen([self.slice_id])


def ended(slice_id: int, since: datetime | None, until: datetime | None) -> None:
    """Record when the holder stopped running on the slice (its container gone), with the start if none was
    recorded (a report of the start that never came); never before the start, and the first end stands."""
    if since is None or until is None:
        return
    started(slice_id, since)
    Slice.objects.filter(pk=slice_id, held_until__isnull=True).update(held_until=Greatest(until, F("held_from")))


def end(
    slice_id: int, until: datetime | None, reason: str, since: datetime | None = None, release: bool = True
) -> None:
    """The end of a holding, for every kind of workload: its end recorded (``until``, the engine's moment; if
    the engine cannot tell, the last proof of life), billing asked to charge it to that end once this commits
    (lost, the next tick does it), and the slice released (``release=False``: the caller releases it, e.g. to
    hand it over). ``since`` is the start, for a holding whose start was never recorded on the slice. A slice
    already released and ended is left as it is."""
    with transaction.atomic():
        taken = Slice.objects.select_for_update().get(pk=slice_id)
        since = taken.held_from or since
        if since is not None:
            ended(slice_id, since, until or taken.seen_at or since)
            send_on_commit(CHARGE_HOLDING, slice_id)
        if release and taken.released_at is None:  # locked: no other release gets between
            workloads.release(slice_id, reason)  # to a launch waiting for it, where one waits


def last_proof(taken: Slice) -> datetime | None:
    """When its holder was last known to run on it: its end, else its last proof of life, else its start."""
    return taken.held_until or taken.seen_at or taken.held_from
