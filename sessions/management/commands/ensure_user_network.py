"""Create the Docker network user containers run on and the host firewall around it (run as root)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions.runtime.docker import RuntimeError_
from sessions.runtime.firewall import FirewallError
from sessions.runtime.isolation import isolate, tear_down


class Command(BaseCommand):
    help = "Create the user-container bridge and its firewall rules (PORTAL_NOTEBOOK_NETWORK, _SUBNET, _INTERNET)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--remove", action="store_true", help="Remove the network and its rules instead.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["remove"]:
                tear_down()
                self.stdout.write("user containers: network and firewall rules removed")
                return
            self.stdout.write(isolate())
        except (RuntimeError_, FirewallError) as error:
            raise CommandError(f"cannot isolate user containers: {error}") from None
