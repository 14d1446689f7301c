"""Pages of the sessions app. The GPU fleet and notebook issues fill them."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.access import staff_required


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    return render(request, "sessions/session_list.html")


@login_required
def render_job_list(request: HttpRequest) -> HttpResponse:
    return render(request, "sessions/render_job_list.html")


@staff_required
def fleet(request: HttpRequest) -> HttpResponse:
    return render(request, "sessions/fleet.html")
