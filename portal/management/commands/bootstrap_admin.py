"""Create the first administrator once, without questions.

Credentials come from PORTAL_ADMIN_USERNAME / PORTAL_ADMIN_EMAIL /
PORTAL_ADMIN_PASSWORD; without a password one is generated and printed once.
Does nothing when any superuser already exists.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction

from portal.env import Env
from portal.roles import OPERATORS, USERS


class Command(BaseCommand):
    help = "Create the first administrator account if there is none."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("admin: an administrator account already exists; nothing to do.")
            return
        env = Env()
        username = env.text("PORTAL_ADMIN_USERNAME", "admin")
        email = env.text("PORTAL_ADMIN_EMAIL", "admin@localhost")
        password = env.secret("PORTAL_ADMIN_PASSWORD")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(12)
        with transaction.atomic():
            user = User.objects.create_superuser(username=username, email=email, password=password)
            for name in (USERS, OPERATORS):
                user.groups.add(Group.objects.get_or_create(name=name)[0])
        self.stdout.write(self.style.SUCCESS(f"admin: created administrator {username!r}."))
        if generated:
            self.stdout.write(
                self.style.WARNING(f"admin: its password is {password}  (shown once; change it after logging in)")
            )
