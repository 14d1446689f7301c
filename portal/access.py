"""Access helpers shared by views, consumers and APIs."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from portal.roles import is_operator

View = Callable[..., HttpResponse]


def staff_required(view: View) -> View:
    """Anonymous people go to the login page; logged-in non-staff get a 403."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_operator(request.user):
            raise PermissionDenied("This page is for operators.")
        return view(request, *args, **kwargs)

    return login_required(wrapped)
