"""Starting, following and ending notebook sessions: the only code that changes them.

Every exit from a session releases its slice in the same transaction, and
each lifecycle moment is stamped once (see NotebookSession.stamp).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from portal import push
from portal.celery import send, send_on_commit
from portal.roles import can_launch, launch_refusal
from sessions import access
from sessions.gpus import holdings, orders, workloads
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.notebooks import access as notebook_access
from sessions.notebooks import spot
from sessions.notebooks.hub import Hub, HubError, HubUnavailable
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.runtime import engines
from sessions.runtime.docker import DockerRuntime, RuntimeError_

log = logging.getLogger(__name__)
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,38}$")
State = NotebookSession.State
MAX_RETRY_PAUSE_S = 30
# The Celery task that asks the hub (sessions.notebooks.tasks registers it under this name): enqueued by
# name, because the tasks module imports this one.
START_NOTEBOOK = "sessions.notebooks.tasks.start_notebook"
SIGKILL_EXIT = 137
# What owners read when something went wrong: words, never an exception's text (that goes to failure_detail).
WAITING_FOR_HUB = "Waiting for the notebook service to answer"
HUB_NEVER_ANSWERED = (
    "The notebook service did not answer for {minutes} minutes, so the session was not started. "
    "Try again in a few minutes; if it keeps happening, tell an operator."
)
HUB_REFUSED = "The notebook service refused to start this session. Try again; if it keeps happening, tell an operator."
LAUNCH_FAILED = "The session's container could not be started. Try again; if it keeps happening, tell an operator."
CRASHED = "The session stopped unexpectedly: {cause}. Files in work/ are kept; start a new session to go on."
WAITING_FOR_SPOT = "Waiting for a spot session to hand over its slice, at {due:%H:%M:%S} UTC"
SPOT_HANDED_OVER = "Slice handed over by a spot session"
SPOT_DID_NOT_FIT = (
    "The spot slice this session waited for was freed, but the session did not fit on it after all. "
    "Try again; if it keeps happening, tell an operator."
)


class LaunchRefused(Exception):
    """Nothing was started or allocated; ``reason`` says why, for the form."""

    def __init__(self, reason: str, code: str = "refused") -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


@dataclass(frozen=True)
class Launch:
    request: SliceRequest
    image_id: int
    server_name: str
    spot: bool = False
    display_name: str = ""


def start_session(owner: User, launch: Launch) -> NotebookSession:
    """Allocate a slice and record the session; the hub is asked to start it after commit.

    An on-demand launch that finds no room may wait for a spot slice instead (``spot.wait_for_spot``):
    it is recorded allocating, and gets the slice when the spot session is gone. One whose credit does not
    carry it is refused by the allocation's gate (``sessions.gpus.workloads``), under the owner's lock.
    """
    if not can_launch(owner):
        raise LaunchRefused(launch_refusal(), code="role")
    if not NAME.match(launch.server_name):
        raise LaunchRefused("A session name takes lower-case letters, digits and '-', up to 39, e.g. 'train-1'.")
    image = NotebookImage.objects.filter(pk=launch.image_id, enabled=True).first()
    if image is None:
        raise LaunchRefused("That image is not on the list of images you may start.", code="image")
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=owner.pk).first()
        _check_session_limits(owner, launch.server_name)
        session = NotebookSession.objects.create(
            owner=owner,
            server_name=launch.server_name,
            display_name=launch.display_name[:80],
            image=image,
            spot=launch.spot,
            state=State.ALLOCATING,
        )
        market = Slice.Market.SPOT if launch.spot else Slice.Market.ON_DEMAND
        request = replace(launch.request, market=market)
        try:
            session.slice = allocate(owner, request, holder=Holder.notebook(session.pk))
        except AllocationRefused as refused:
            spot_due = None if launch.spot or refused.code != "no_capacity" else spot.wait_for_spot(session, request)
            if spot_due is None:
                raise LaunchRefused(refused.reason, code=refused.code) from None
            return _waiting_for_spot(session, spot_due)
        _start_on(session, session.slice, "Slice allocated")
    return session


def _start_on(session: NotebookSession, taken: Slice, message: str) -> None:
    """The session has its slice: it is starting, its owner's pages hear so, and its start's task is sent once
    this commits. A broker that does not answer then leaves it starting, its start never noted as sent, and
    the launch lands on the sessions page all the same; reconciliation sends the start again."""
    session.slice, session.state, session.progress = taken, State.STARTING, 10
    session.progress_message, session.progress_at = message, timezone.now()
    session.save(update_fields=["slice", "state", "progress", "progress_message", "progress_at"])
    _announce(session)
    session_id = session.pk
    send_on_commit(START_NOTEBOOK, session_id, noted=lambda: _start_heard_of(session_id))


def _waiting_for_spot(session: NotebookSession, due: datetime) -> NotebookSession:
    session.progress_message, session.progress_at = WAITING_FOR_SPOT.format(due=due), timezone.now()
    session.save(update_fields=["progress_message", "progress_at"])
    _announce(session)
    return session


def _announce(session: NotebookSession) -> None:
    """Tell the owner's open pages, once the change is committed, that a session changed."""
    payload = {"type": "session.changed", "session": session.pk, "state": session.state}
    # robust: a notice that cannot be sent must never undo or fail a state change.
    transaction.on_commit(lambda: push.notify_user(session.owner_id, payload), robust=True)


def _check_session_limits(owner: User, server_name: str) -> None:
    active = NotebookSession.objects.filter(owner=owner, state__in=NotebookSession.ACTIVE)
    if active.filter(server_name=server_name).exists():
        raise LaunchRefused(f"You already have a session named {server_name!r}; stop it or pick another name.")
    if active.filter(state__in=[State.REQUESTED, State.ALLOCATING, State.STARTING]).exists():
        raise LaunchRefused("One of your sessions is still starting; wait until it runs.", code="starting")
    if active.count() >= settings.MAX_SESSIONS_PER_USER:
        raise LaunchRefused(f"You have {settings.MAX_SESSIONS_PER_USER} sessions, your limit; stop one first.")


def send_start_again(session_id: int) -> None:
    """Reconciliation's part: hand a starting session's lost start to the broker (raising if it does not
    answer), and note that it got there. A start asked twice starts one server (``Hub.start_server``)."""
    send(START_NOTEBOOK, session_id, noted=lambda: _start_heard_of(session_id))


def _start_heard_of(session_id: int) -> None:
    """Its start's task reached the broker, or runs (each try while the hub is silent): it is not lost."""
    NotebookSession.objects.filter(pk=session_id, state=State.STARTING).update(start_sent_at=timezone.now())


def ask_hub_to_start(session_id: int, attempt: int = 0) -> float | None:
    """Worker side: ask the hub to start the named server (the hub learns of the person on first use).

    A hub that does not answer (restarting, say) is asked again with a growing pause, for
    PORTAL_HUB_START_PATIENCE_SECONDS from the request; returns the seconds to wait before the
    next try, or None when there is nothing more to do.
    """
    session = NotebookSession.objects.select_related("owner").get(pk=session_id)
    if session.state != State.STARTING:
        return None
    _start_heard_of(session.pk)
    try:
        orders.wait_for_slice(session.slice_id or 0)  # its host's agent makes its MIG instance first
    except orders.OrderFailed as failed:
        fail(session.pk, failed.reason)
        return None
    try:
        Hub().start_server(session.owner.get_username(), session.server_name, {"session": session.pk})
    except HubUnavailable as error:
        waited = (timezone.now() - session.start_clock).total_seconds()
        if waited < settings.HUB_START_PATIENCE_SECONDS:
            log.warning("session %s: the hub did not answer (try %s): %s", session.pk, attempt + 1, error)
            note_step(session.pk, WAITING_FOR_HUB)
            return float(min(MAX_RETRY_PAUSE_S, 2**attempt))
        minutes = round(settings.HUB_START_PATIENCE_SECONDS / 60)
        fail(session.pk, HUB_NEVER_ANSWERED.format(minutes=minutes), detail=str(error))
    except HubError as error:
        fail(session.pk, HUB_REFUSED, detail=str(error))
    return None


def note_step(session_id: int, message: str) -> None:
    """Show a launch step on the card; its clock starts when the step changes, not at each repeat."""
    with transaction.atomic():
        session = NotebookSession.objects.select_for_update().get(pk=session_id)
        if session.state != State.STARTING or session.progress_message == message:
            return
        session.progress_message, session.progress_at = message[:200], timezone.now()
        session.save(update_fields=["progress_message", "progress_at"])
        _announce(session)


def launch_spec_for(username: str, server_name: str) -> NotebookSession | None:
    """The starting session a spawner may launch for this hub user and server, if any."""
    found = notebook_access.sessions_for_hub_user(username).select_related("slice", "slice__gpu", "image", "owner")
    return found.filter(server_name=server_name, state=State.STARTING).first()


def record_event(
    session_id: int,
    event: str,
    container_id: str = "",
    message: str = "",
    at: datetime | None = None,
    end: ContainerEnd | None = None,
    reason: str = "",
) -> NotebookSession:
    """What the spawner reports: progress, container started, ready, stopped, failed.

    ``at`` is the engine's own moment for a container that started; ``end`` how it ended (FinishedAt,
    exit code). ``message`` of a failure is the spawner's technical text: operators see it, owners do not;
    ``reason``, where the spawner gives one, is what its owner reads instead of the general words (a cluster
    with no room for the slice, say).
    """
    with transaction.atomic():
        session = NotebookSession.objects.select_for_update().get(pk=session_id)
        if event == "progress" and session.state == State.STARTING:
            session.progress_message, session.progress_at = message[:200], timezone.now()
            session.progress = min(95, session.progress + 20)
        elif event == "container_started":
            if session.stamp("container_started_at", at) and session.slice_id:
                holdings.started(session.slice_id, session.container_started_at)
            session.container_id = container_id[:80] or session.container_id
        elif event == "ready" and session.state == State.STARTING:
            session.stamp("ready_at")
            session.state, session.progress, session.progress_message = State.RUNNING, 100, "Ready"
        elif event == "stopped":
            return _container_ended(session, end or ContainerEnd(at=at))
        elif event == "failed":
            return _failed(session, reason or LAUNCH_FAILED, detail=message)
        session.save()
        _announce(session)
        return session


def stop_session(session_id: int, by: User | None, reason: str = NotebookSession.EndReason.USER) -> NotebookSession:
    """Mark the session stopping and, once that commits, ask the hub to stop its server; the end is recorded
    when its container is gone, and charged to that moment. A hub that does not answer leaves it stopping, the
    stop not noted as taken: reconciliation asks again (``ask_hub_to_stop``).

    ``by`` is the person asking (see ``sessions.access``); None means the portal itself (culling, credit).
    An operator ending someone else's session is recorded as such, so its owner reads who stopped it.
    """
    with transaction.atomic():
        session = NotebookSession.objects.select_for_update().select_related("owner").get(pk=session_id)
        if by is not None and not access.may(by, access.Action.STOP, session):
            raise LaunchRefused("No such session among yours.", code="not_yours")
        if not session.active:
            return session
        if by is not None and by.pk != session.owner_id and reason == NotebookSession.EndReason.USER:
            reason = NotebookSession.EndReason.STAFF
        if session.state == State.ALLOCATING:  # waiting for a spot slice: nothing runs, no hub to ask
            spot.give_up(session.pk)
            session.ended_reason = reason
            return _end(session, reason)
        session.state, session.ended_reason, session.stop_sent_at = State.STOPPING, reason, None
        session.save(update_fields=["state", "ended_reason", "stop_sent_at"])
        _announce(session)
        transaction.on_commit(lambda: ask_hub_to_stop(session), robust=True)
    return session


def ask_hub_to_stop(session: NotebookSession) -> bool:
    """Ask the hub to stop a stopping session's server (asking again is harmless), and note that it took the
    request; returns whether it did. The session ends when its container is gone, reconciliation sees to it."""
    try:
        Hub().stop_server(session.owner.get_username(), session.server_name)
    except HubError as error:
        log.warning("stopping %s: %s", session, error)
        return False
    NotebookSession.objects.filter(pk=session.pk, state=State.STOPPING).update(stop_sent_at=timezone.now())
    return True


def preempt_spot(reclaim_id: int) -> Holder | None:
    """The grace time of a reclaim is up: its spot holder, of whatever kind, gives the slice up (reason
    preempted) through the workload registry; the holding's end hands the slice over. Returns that holder.

    Nothing happens when it is not due yet, already settled or stopping, or its waiting session gave up.
    """
    due = spot.due_spot_holder(reclaim_id)
    if due is None:
        return None
    holder, slice_id = due
    workloads.kind_of(holder).give_up(holder.id, slice_id, workloads.Reason.PREEMPTED)
    return holder


def release_handing_over(slice_id: int, reason: str) -> None:
    """The workload registry's releaser: give a slice back, and where an on-demand launch waits for it (a spot
    reclaim), allocate for it in the same turn and start it there."""
    handed = spot.release_to_waiting(slice_id, reason=reason)
    if handed is not None:
        _take_over(handed)


def preempt_due_spot() -> int:
    """Beat's sweep: every reclaim past its grace time, in case its own task was lost. Returns how many."""
    return sum(preempt_spot(reclaim_id) is not None for reclaim_id in spot.due_reclaims())


def exempt_from_idle_stop(session_id: int, exempt: bool = True) -> NotebookSession:
    """Operators: never stop this session for being idle (the maximum age still applies), or again do.

    Exempting withdraws a warning already given, which may have been the idle one; the next cull
    warns again if the maximum age is near.
    """
    with transaction.atomic():
        session = NotebookSession.objects.select_for_update().get(pk=session_id)
        if session.idle_exempt == exempt:
            return session
        session.idle_exempt = exempt
        if exempt:
            session.warned_at, session.warning = None, ""
        session.save(update_fields=["idle_exempt", "warned_at", "warning"])
        _announce(session)
    return session


def fail(session_id: int, message: str, detail: str = "", forget: bool = False) -> NotebookSession:
    """A session that could not start: ``message`` for its owner, in words; ``detail`` for operators."""
    with transaction.atomic():
        session = NotebookSession.objects.select_for_update().get(pk=session_id)
        ended = _failed(session, message, detail)
        if forget:
            transaction.on_commit(lambda: _forget_server(session_id), robust=True)
    return ended


def _failed(
    session: NotebookSession,
    message: str,
    detail: str,
    reason: str = NotebookSession.EndReason.FAILURE,
    gone_at: datetime | None = None,
) -> NotebookSession:
    """End a session that went wrong; what was said of an end already recorded is never rewritten."""
    if session.state not in NotebookSession.ENDED:
        session.failure_message, session.failure_detail = message[:2000], detail[:4000]
    return _end(session, reason, failed=True, gone_at=gone_at)


@dataclass(frozen=True)
class ContainerEnd:
    """How a session's container ended, as the engine recorded it (all unknown if it was removed)."""

    at: datetime | None = None
    exit_code: int | None = None
    oom_killed: bool = False

    def cause(self) -> str:
        if self.oom_killed:
            return f"it ran out of memory (exit code {self.exit_code})"
        if self.exit_code is None:
            return "it was removed"
        if self.exit_code == SIGKILL_EXIT:
            return "it was killed (exit code 137)"
        return f"it exited with code {self.exit_code}"


def container_ended(session_id: int, end: ContainerEnd) -> NotebookSession:
    """Reconciliation found a session's container stopped or gone: record how, free the slice, tell the hub."""
    with transaction.atomic():
        session = NotebookSession.objects.select_for_update().get(pk=session_id)
        ended = _container_ended(session, end)
        transaction.on_commit(lambda: _forget_server(session_id), robust=True)
    return ended


def _container_ended(session: NotebookSession, end: ContainerEnd) -> NotebookSession:
    """Asked to stop, it stopped; a clean exit nobody asked for was a shut-down from inside; else a crash."""
    if session.state == State.STOPPING:
        return _end(session, NotebookSession.EndReason.USER, gone_at=end.at)
    if end.exit_code == 0 and not end.oom_killed:
        return _end(session, NotebookSession.EndReason.INSIDE, gone_at=end.at)
    detail = f"exit code {end.exit_code}, OOM killed {end.oom_killed}, finished at {end.at}"
    return _failed(session, CRASHED.format(cause=end.cause()), detail, NotebookSession.EndReason.CRASHED, end.at)


def _died_at(session: NotebookSession) -> datetime | None:
    """When the engine saw the container die, for an end reported without the moment (it was removed)."""
    assert session.container_started_at is not None
    try:
        runtime = engines.for_slice(session.slice) if session.slice else DockerRuntime()
        return runtime.died_at(session.pk, since=session.container_started_at)
    except RuntimeError_ as error:
        log.warning(
            "session %s: the engine cannot say when it ended; it ends at its last proof of life: %s", session.pk, error
        )
        return None


def _forget_server(session_id: int) -> None:
    session = NotebookSession.objects.select_related("owner").get(pk=session_id)
    try:
        Hub().stop_server(session.owner.get_username(), session.server_name)
    except HubError as error:
        log.info("the hub could not forget %s: %s", session, error)


def _end(
    session: NotebookSession, reason: str, failed: bool = False, gone_at: datetime | None = None
) -> NotebookSession:
    if session.state in NotebookSession.ENDED:
        return session
    if session.container_started_at:
        gone_at = gone_at or _died_at(session) or _last_proof(session)
        session.stamp("container_gone_at", max(gone_at, session.container_started_at))
        if session.slice_id:
            holdings.end(
                session.slice_id, session.container_gone_at, "", since=session.container_started_at, release=False
            )
    session.ended_reason = session.ended_reason or reason or NotebookSession.EndReason.RECONCILIATION
    session.state = State.FAILED if failed else State.STOPPED
    if session.ended_reason == NotebookSession.EndReason.PREEMPTED and not failed:
        session.state = State.PREEMPTED
    session.stamp("ended_at")
    session.save()
    _announce(session)
    if session.slice_id and session.slice and session.slice.active:
        release_handing_over(session.slice_id, reason=f"notebook {session.state}")
    return session


def _last_proof(session: NotebookSession) -> datetime:
    """An end the engine cannot tell (the container and its events are gone): the last moment it was known to
    run, never the moment the portal noticed, so nobody pays for time nobody can prove."""
    taken = Slice.objects.filter(pk=session.slice_id).first() if session.slice_id else None
    proof = holdings.last_proof(taken) if taken is not None else None
    assert session.container_started_at is not None
    return proof or session.container_started_at


def _take_over(handed: spot.HandOver) -> None:
    """The session that waited for a spot slice: starting on its new slice, or failed with why not."""
    waiting = NotebookSession.objects.get(pk=handed.session_id)  # locked by the hand-over
    if handed.taken is None:
        _failed(waiting, SPOT_DID_NOT_FIT, detail=handed.refused)
        return
    _start_on(waiting, handed.taken, SPOT_HANDED_OVER)
