"""The portal's own pages: dashboard, sign-up, health check."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from portal.forms import SignupForm
from portal.http import PortalRequest
from portal.models import WorkerHeartbeat
from portal.roles import USERS, is_operator


def hub_user_path(request: HttpRequest, rest: str) -> HttpResponse:
    query = request.META.get("QUERY_STRING", "")
    return HttpResponseRedirect(f"/jupyter/hub/user/{rest}" + (f"?{query}" if query else ""))


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness probe; also the bare-Django baseline of the dashboard benchmark."""
    return HttpResponse("ok", content_type="text/plain")


@login_required
def dashboard(request: PortalRequest) -> HttpResponse:
    from sessions.notebooks.models import NotebookSession
    from sessions.render.models import RenderJob

    active = NotebookSession.objects.filter(owner_id=request.user.pk, state__in=NotebookSession.ACTIVE)
    mine = list(active.values_list("state", "warning"))
    context = {
        "heartbeats": _heartbeats(request),
        "running_sessions": sum(state == NotebookSession.State.RUNNING for state, _ in mine),
        "session_warnings": [warning for _, warning in mine if warning],
        # Counted when the card is rendered (the template calls it), not for the partials htmx asks for.
        "running_render_jobs": RenderJob.objects.filter(owner_id=request.user.pk, state__in=RenderJob.RUNNING).count,
    }
    if request.htmx and request.htmx.target in {"workers", "session-warnings"}:
        part = "workers" if request.htmx.target == "workers" else "warnings"
        return render(request, f"portal/dashboard.html#{part}", context)
    return render(request, "portal/dashboard.html", context)


def _heartbeats(request: PortalRequest) -> list[WorkerHeartbeat]:
    if not is_operator(request.user):
        return []
    return list(WorkerHeartbeat.objects.all())


def signup(request: HttpRequest) -> HttpResponse:
    if not settings.SIGNUP_ENABLED:
        raise Http404("Sign-up is switched off on this portal.")
    if request.user.is_authenticated:
        return redirect("dashboard")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        user.groups.add(Group.objects.get_or_create(name=USERS)[0])
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, "Welcome! Your account is ready.")
        return redirect("dashboard")
    return render(request, "registration/signup.html", {"form": form})
