"""Register (or refresh) JupyterHub's OAuth client; the plain secret lands in the data directory."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from portal.sso.clients import hub_secret_path, register_hub_client


class Command(BaseCommand):
    help = "Create or update the JupyterHub OAuth client of the portal's OpenID provider."

    def handle(self, *args: Any, **options: Any) -> None:
        client_id, _ = register_hub_client()
        self.stdout.write(f"sso: hub client {client_id!r} registered; its secret is in {hub_secret_path()}")
