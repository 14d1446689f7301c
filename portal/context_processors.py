"""Values every page template needs: site name, role flags for the navigation."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest

from portal.roles import can_view_finance, is_operator


def portal(request: HttpRequest) -> dict[str, Any]:
    # A request refused before the auth middleware ran (a Host outside ALLOWED_HOSTS, say) has no user,
    # and its error page must render all the same.
    user = getattr(request, "user", None) or AnonymousUser()
    return {
        "portal_name": settings.SITE_NAME,
        "signup_enabled": settings.SIGNUP_ENABLED,
        "user_is_operator": is_operator(user),
        "user_can_view_finance": can_view_finance(user),
    }
