"""The Sessions page (launch form, live session cards) and the operators' page of everyone's sessions.

Both swap their regions with htmx and work without JavaScript."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.access import staff_required
from portal.http import PortalRequest
from portal.roles import can_launch, launch_refusal
from sessions import access
from sessions.gpus import pricing, workloads
from sessions.gpus.holders import Holder
from sessions.gpus.offers import offers, request_for
from sessions.metrics.agent import latest_frames
from sessions.metrics.frames import device_utilisation
from sessions.metrics.history import session_history
from sessions.notebooks import access as notebook_access
from sessions.notebooks import storage
from sessions.notebooks.forms import LaunchForm
from sessions.notebooks.models import NotebookSession
from sessions.notebooks.services import Launch, LaunchRefused, start_session
from sessions.storage import shown, usage

PAGE = "sessions/session_list.html"
EVERYONE = "sessions/all_sessions.html"
LIVE_FOR_S = 10.0  # an agent's latest frame older than this is no longer "live"


def _person(request: PortalRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


def _page(request: PortalRequest, form: LaunchForm | None = None, status: int = 200) -> HttpResponse:
    user = request.user
    assert isinstance(user, User)
    sessions = list(
        NotebookSession.objects.filter(owner=user)
        .select_related("slice__gpu__host", "image")
        .order_by("-requested_at")[:20]
    )
    found = usage.usage_of(user)
    context: dict[str, object] = {
        "sessions": sessions,
        "changing": any(s.state in NotebookSession.CHANGING for s in sessions),
        "storage": shown.section(found),
        "storage_warning": storage.card_warning(found),
    }
    target = request.htmx.target if request.htmx else None
    if not can_launch(user):
        context["refusal"] = launch_refusal()
    elif target != "session-cards":  # the cards poll often and show no form: skip the fleet-wide offers
        context["form"] = form or LaunchForm(offers=offers(user))
        context["wallet"] = pricing.current().wallet(user)
    if target in ("session-cards", "launch"):
        return render(request, f"{PAGE}#{target}", context, status=status)
    return render(request, PAGE, context, status=status)


@login_required
def session_list(request: PortalRequest) -> HttpResponse:
    return _page(request)


@login_required
@require_POST
def launch(request: PortalRequest) -> HttpResponse:
    if not can_launch(request.user):
        return _page(request, status=403)
    form = LaunchForm(request.POST, offers=offers(request.user if isinstance(request.user, User) else None))
    if form.is_valid() and (refusal := storage.launch_refusal(_person(request))):
        form.add_error(None, refusal)  # nothing is allocated while the person's files fill their quota
    elif form.is_valid():
        wanted = request_for(form.cleaned_data["offer"])
        assert wanted is not None and isinstance(request.user, User)
        launch = Launch(
            wanted, form.cleaned_data["image"].pk, form.cleaned_data["server_name"], form.cleaned_data["spot"]
        )
        try:
            start_session(request.user, launch)
        except LaunchRefused as refused:
            form.add_error(None, refused.reason)
        else:
            messages.success(request, f"Starting {launch.server_name}: this takes a few seconds.")
            return redirect("session-list") if not request.htmx else _page(request)
    return _page(request, form)


@login_required
@require_POST
def stop(request: PortalRequest, session_id: int) -> HttpResponse:
    """Its owner, or an operator from the all-sessions page, stops a session; anyone else gets a 404."""
    session = notebook_access.session_for(request.user, session_id, access.Action.STOP)
    assert isinstance(request.user, User)
    workloads.stop(Holder.notebook(session.pk), workloads.Reason.USER, by=request.user)  # an operator's: STAFF
    mine = session.owner_id == request.user.pk
    messages.info(request, f"Stopping {session.server_name}" + ("." if mine else f" of {session.owner}."))
    from_everyone = request.POST.get("back") == "all"  # the all-sessions page's form says so
    if request.htmx:
        return _everyone(request) if from_everyone else _page(request)
    return redirect("session-all" if from_everyone else "session-list")


@dataclass(frozen=True)
class Row:
    """One session on the operators' page, with its device's utilisation in the latest live frame."""

    session: NotebookSession
    live: bool  # the device is in a live frame (it may still report no utilisation: None)
    utilisation: float | None


@staff_required
@require_GET
def all_sessions(request: PortalRequest) -> HttpResponse:
    return _everyone(request)


def _everyone(request: PortalRequest) -> HttpResponse:
    active = notebook_access.sessions_for(request.user).filter(state__in=NotebookSession.ACTIVE)
    sessions = active.select_related("owner", "slice__gpu__host", "image").order_by("requested_at")
    try:
        live: dict[str, float | None] | None = device_utilisation(latest_frames().values(), time.time(), LIVE_FOR_S)
    except redis.RedisError:
        live = None
    rows = [_row(session, live or {}) for session in sessions]
    context = {"rows": rows, "live_unavailable": live is None}
    target = "#all-sessions" if request.htmx and request.htmx.target == "all-sessions" else ""
    return render(request, EVERYONE + target, context)


def _row(session: NotebookSession, live: dict[str, float | None]) -> Row:
    device = session.slice.device_uuid if session.slice else ""
    return Row(session, device in live, live.get(device))


@login_required
@require_GET
def session_detail(request: PortalRequest, session_id: int) -> HttpResponse:
    """One session: its state, live charts of its slice (sessions.metrics) and its whole per-minute history."""
    session = notebook_access.session_for(request.user, session_id, access.Action.VIEW)
    context = {"session": session, "history": session_history(session.pk)}
    return render(request, "sessions/session_detail.html", context)
