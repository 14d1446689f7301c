"""Spot workloads give way to on-demand launches: the notice, the grace time and the hand-over of the slice.

An on-demand launch refused for capacity may take a spot slice of any kind of workload
(``allocator.reclaimable``): the launch waits, the spot holder's owner is told, and
PORTAL_SPOT_GRACE_SECONDS later the holder gives the slice up through the workload registry (a notebook
session stops with reason ``preempted``; a render job's chunk there is put back and its job goes on on its
other slices). When its container is gone, the release of its slice and the allocation for the waiting
session happen in one transaction and one allocation turn (``release_to_waiting``, the registry's releaser),
so nobody else takes the room. The session services call these functions; they change reclaims, never a
session's state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal import push
from portal.celery import send_on_commit
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate, reclaimable, release, take_turn
from sessions.gpus.holders import Holder, HolderKind
from sessions.gpus.models import Reclaim, Slice
from sessions.notebooks.models import NotebookSession

log = logging.getLogger(__name__)
# The task that stops a spot session whose grace time is up (sessions.notebooks.tasks registers it).
PREEMPT_SPOT = "sessions.notebooks.tasks.preempt_spot"
State = NotebookSession.State
Pending = Reclaim.State.PENDING


@dataclass(frozen=True)
class HandOver:
    """What a released spot slice left for the session that waited for it: a slice, or why none."""

    session_id: int
    taken: Slice | None = None
    refused: str = ""


def wait_for_spot(session: NotebookSession, request: SliceRequest) -> datetime | None:
    """Promise ``session`` (an on-demand launch just refused for capacity) a spot slice, if one would make room.

    Runs in the launch's transaction, whose refused allocation still holds the pool's turn: a second
    launch waits for it and then finds the slice promised. Tells the spot session's owner and has its
    stop enqueued for when the grace time is up. Returns that moment, or None when no spot slice fits.
    """
    taken = reclaimable(request)
    if taken is None:
        return None
    now = timezone.now()
    due = now + timedelta(seconds=int(settings.SPOT_GRACE_SECONDS))
    try:
        with transaction.atomic():  # the constraints are the last word if two launches got here at once
            reclaim = Reclaim.objects.create(
                slice=taken,
                waiting_kind=HolderKind.NOTEBOOK,
                waiting_id=session.pk,
                owner_id=session.owner_id,
                request_kind=request.kind,
                request_profile=request.profile,
                request_model=request.model,
                request_host=request.host,
                noticed_at=now,
                due_at=due,
            )
    except IntegrityError:
        return None
    _notice(taken, now, due)
    # Lost with a broker that does not answer, it is made up for by beat's sweep (``preempt_due_spot``).
    send_on_commit(PREEMPT_SPOT, reclaim.pk, countdown=int(settings.SPOT_GRACE_SECONDS))
    return due


def _notice(taken: Slice, now: datetime, due: datetime) -> None:
    """The spot holder's notice: a session's on its card and the dashboard (``warning``), and over the websocket
    for every kind. Stamped with the reclaim's own moment, so a cancelled reclaim withdraws its notice and no
    other."""
    holder = taken.holder
    spot = NotebookSession.objects.filter(slice=taken).first() if holder and holder.kind == "notebook" else None
    if spot is None:
        what = holder.label if holder is not None else "A spot workload"
        text = (
            f"{what} gives back a spot slice to an on-demand launch at {due:%H:%M:%S} UTC; what it renders there"
            " is rendered again on another slice."
        )
        payload = {"type": "workload.warning", "text": text}
        transaction.on_commit(lambda: push.notify_user(taken.owner_id, payload), robust=True)
        return
    text = (
        f"Spot session {spot.server_name} is reclaimed for an on-demand session: it stops at {due:%H:%M:%S} UTC."
        " Save your work to work/ now."
    )
    NotebookSession.objects.filter(pk=spot.pk).update(warned_at=now, warning=text[:200])
    session_payload = {"type": "session.warning", "session": spot.pk, "text": text}
    transaction.on_commit(lambda: push.notify_user(spot.owner_id, session_payload), robust=True)


def due_spot_holder(reclaim_id: int, now: datetime | None = None) -> tuple[Holder, int] | None:
    """The spot holder to make give its slice up now for this reclaim, and the slice; None: not due yet, settled,
    already stopping, or its waiting session gave up meanwhile (then the reclaim is cancelled and the holder
    goes on)."""
    now = now or timezone.now()
    reclaim = Reclaim.objects.filter(pk=reclaim_id, state=Pending, due_at__lte=now).select_related("slice").first()
    if reclaim is None:
        return None
    waiting = NotebookSession.objects.filter(pk=reclaim.waiting_id, state=State.ALLOCATING).exists()
    if reclaim.waiting_kind != HolderKind.NOTEBOOK or not waiting:
        _cancel(reclaim)
        return None
    holder = reclaim.slice.holder
    if holder is None or reclaim.slice.released_at is not None:
        return None
    if holder.kind == HolderKind.NOTEBOOK:
        spot = NotebookSession.objects.filter(slice_id=reclaim.slice_id).exclude(state=State.STOPPING).first()
        return (holder, reclaim.slice_id) if spot is not None and spot.active else None
    return holder, reclaim.slice_id


def due_reclaims(now: datetime | None = None) -> list[int]:
    """Reclaims whose grace time is up (the sweep's, in case a task was lost)."""
    due = Reclaim.objects.filter(state=Pending, due_at__lte=now or timezone.now())
    return list(due.order_by("due_at").values_list("pk", flat=True))


def give_up(session_id: int) -> None:
    """A waiting session was stopped: its reclaim is cancelled and the spot session's notice withdrawn."""
    reclaim = Reclaim.objects.filter(waiting_kind=HolderKind.NOTEBOOK, waiting_id=session_id, state=Pending).first()
    if reclaim is not None:
        _cancel(reclaim)


def _cancel(reclaim: Reclaim) -> None:
    cancelled = Reclaim.objects.filter(pk=reclaim.pk, state=Pending)
    if not cancelled.update(state=Reclaim.State.CANCELLED, settled_at=timezone.now()):
        return
    # After commit, in a transaction of its own: the spot session's row is locked by its own end path
    # before a waiting session's, and here the waiting session's is held.
    transaction.on_commit(lambda: _withdraw_notice(reclaim), robust=True)


def _withdraw_notice(reclaim: Reclaim) -> None:
    noticed = NotebookSession.objects.filter(slice_id=reclaim.slice_id, warned_at=reclaim.noticed_at)
    spot = noticed.exclude(state__in=[State.STOPPING, *NotebookSession.ENDED]).first()
    if spot is None:
        return
    NotebookSession.objects.filter(pk=spot.pk, warned_at=reclaim.noticed_at).update(warned_at=None, warning="")
    push.notify_user(spot.owner_id, {"type": "session.changed", "session": spot.pk, "state": spot.state})


def release_to_waiting(slice_id: int, reason: str) -> HandOver | None:
    """Release a slice; if a session waits for it, allocate for that session in the same turn and transaction.

    Locks the waiting session first, then its reclaim (``give_up`` takes them in that order), then its
    owner and the pools' turn before the release's GPU row locks (the order of every allocation).
    """
    found = Reclaim.objects.filter(slice_id=slice_id, state=Pending, waiting_kind=HolderKind.NOTEBOOK).first()
    waiting = None
    if found is not None:
        waiting = NotebookSession.objects.select_for_update().filter(pk=found.waiting_id).first()
    reclaim = Reclaim.objects.select_for_update().filter(pk=found.pk, state=Pending).first() if found else None
    if reclaim is None or waiting is None or waiting.state != State.ALLOCATING:
        if reclaim is not None:
            _cancel(reclaim)
        release(slice_id, reason=reason)
        return None
    request = request_of(reclaim)
    User.objects.select_for_update().filter(pk=reclaim.owner_id).first()
    take_turn(request)
    release(slice_id, reason=reason)
    try:
        taken = allocate(reclaim.owner, request, holder=Holder.notebook(waiting.pk))
    except AllocationRefused as refused:
        log.warning("session %s: the reclaimed spot slice %s did not fit after all: %s", waiting.pk, slice_id, refused)
        _settle(reclaim, Reclaim.State.CANCELLED)
        return HandOver(waiting.pk, refused=refused.reason)
    _settle(reclaim, Reclaim.State.HANDED_OVER)
    return HandOver(waiting.pk, taken=taken)


def _settle(reclaim: Reclaim, state: str) -> None:
    reclaim.state, reclaim.settled_at = state, timezone.now()
    reclaim.save(update_fields=["state", "settled_at"])


def request_of(reclaim: Reclaim) -> SliceRequest:
    """What the waiting session asked for, as it asked."""
    return SliceRequest(reclaim.request_kind, reclaim.request_profile, reclaim.request_model, reclaim.request_host)
