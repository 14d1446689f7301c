"""The roles people hold, as Django groups, and the checks views use for them.

users: everyone who can start sessions; operators: staff who run the fleet;
billing: finance people who see everyone's money.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, Group, Permission, User

USERS = "users"
OPERATORS = "operators"
BILLING = "billing"
ROLE_PERMISSIONS: dict[str, list[str]] = {
    USERS: [],
    OPERATORS: [],
    BILLING: ["billing.view_finance"],
}


def ensure_roles(**kwargs: Any) -> None:
    """Create the role groups and give them their permissions (runs after every migrate)."""
    for name, perms in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=name)
        for dotted in perms:
            app_label, codename = dotted.split(".")
            permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
            if permission is not None:
                group.permissions.add(permission)


def is_operator(user: User | AnonymousUser) -> bool:
    return bool(user.is_authenticated and getattr(user, "is_staff", False))


def can_view_finance(user: User | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.has_perm("billing.view_finance"))
