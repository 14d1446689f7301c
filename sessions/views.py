"""Pages of the sessions app that notebook and rendering issues fill; the fleet pages are in sessions.gpus.views."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.roles import can_launch, launch_refusal


@login_required
def render_job_list(request: HttpRequest) -> HttpResponse:
    refusal = None if can_launch(request.user) else launch_refusal()
    return render(request, "sessions/render_job_list.html", {"refusal": refusal})
