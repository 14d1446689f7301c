"""Every error page renders, also for a request that failed before the middleware gave it a user or session."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from django.urls import get_resolver
from django.views.csrf import csrf_failure

pytestmark = pytest.mark.django_db
EARLY = {
    400: "Bad request",
    403: "not allowed",
    404: "Page not found",
    500: "Something went wrong on our side",
}


def test_a_host_outside_the_allowed_hosts_gets_the_400_page_not_a_server_error() -> None:
    client = Client(raise_request_exception=False)
    response = client.get("/", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert "Bad request" in response.content.decode()


def early_request() -> HttpRequest:
    """A request as the handler sees it when a middleware refused it: no user, no session, no messages."""
    request = RequestFactory().get("/somewhere")
    assert not hasattr(request, "user") and not hasattr(request, "session")
    return request


@pytest.mark.parametrize("status", sorted(EARLY))
def test_each_error_page_renders_for_a_request_that_failed_early(status: int) -> None:
    handler: Callable[..., HttpResponse] = get_resolver().resolve_error_handler(status)
    exceptions = {400: ValueError("bad"), 403: PermissionDenied(), 404: Http404()}
    response = handler(early_request(), exceptions[status]) if status in exceptions else handler(early_request())
    assert response.status_code == status
    assert EARLY[status].lower() in response.content.decode().lower()


def test_the_csrf_failure_page_renders_for_a_request_that_failed_early() -> None:
    response = csrf_failure(early_request(), reason="CSRF cookie not set.")
    assert response.status_code == 403
    assert "Form expired" in response.content.decode()
