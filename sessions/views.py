"""Pages of the sessions app that notebook and rendering issues fill; the fleet pages are in sessions.gpus.views."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def render_job_list(request: HttpRequest) -> HttpResponse:
    return render(request, "sessions/render_job_list.html")
