"""Request types for views: the request after our middleware has run."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class PortalRequest(HttpRequest):
    """What views receive: django-htmx's details and a (possibly anonymous) Django user."""

    htmx: HtmxDetails
    user: User | AnonymousUser
