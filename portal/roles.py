"""The roles people hold, as Django groups, and the checks views use for them.

users: everyone who can start sessions; operators: staff who run the fleet;
billing: finance people who see everyone's money.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, Group, Permission, User

USERS = "users"
OPERATORS = "operators"
BILLING = "billing"
ROLE_PERMISSIONS: dict[str, list[str]] = {
    USERS: [],
    # The admin's notebook pages: images, and a session's idle exemption (the rest of a session is read-only).
    OPERATORS: [
        "notebooks.view_notebooksession",
        "notebooks.change_notebooksession",
        "notebooks.view_notebookimage",
        "notebooks.add_notebookimage",
        "notebooks.change_notebookimage",
        "notebooks.delete_notebookimage",
    ],
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


def can_launch(user: User | AnonymousUser) -> bool:
    """Whether someone may start GPU work (sessions, render jobs) and see what is on offer: users and staff."""
    if not user.is_authenticated:
        return False
    return bool(getattr(user, "is_staff", False)) or user.groups.filter(name=USERS).exists()


def launch_refusal() -> str:
    """What someone who may not launch is told: why, and whom to ask."""
    contact = settings.ACCESS_CONTACT or "an operator of this portal"
    return (
        f"Your account is not in the '{USERS}' group, so it cannot start GPU sessions or render jobs. "
        f"Ask {contact} to add you."
    )


def is_operator(user: User | AnonymousUser) -> bool:
    return bool(user.is_authenticated and getattr(user, "is_staff", False))


def can_view_finance(user: User | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.has_perm("billing.view_finance"))
