"""Fence a Swarm GPU host's container bridge (run as root on each host, before its notebooks start; issue 32).

On a Swarm host, notebook tasks sit on the host's own bridge (docker0) and publish their port on the host's
address. The fence lets them reach the hub (PORTAL_HUB_BIND_URL) and, as PORTAL_NOTEBOOK_INTERNET says, the
internet, but none of PORTAL_NOTEBOOK_BLOCKED_RANGES (the other hosts, the portal's services) and nothing of
the host itself; and it lets only the hub's machine (its proxy) open connections to the published ports."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions.runtime.firewall import Firewall, FirewallError
from sessions.runtime.network import NetworkSpecError, host_bridge


class Command(BaseCommand):
    help = "Write the firewall around this Swarm host's container bridge: only the hub out, only its proxy in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hub", default=os.environ.get("PORTAL_HUB_BIND_URL", ""), help="PORTAL_HUB_BIND_URL")
        parser.add_argument("--bridge", default="docker0", help="the bridge the host's tasks run on (docker0)")
        parser.add_argument("--remove", action="store_true", help="Remove the rules instead.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            bridge = host_bridge(settings.USER_NETWORK, options["hub"], options["bridge"])
            firewall = Firewall(bridge)
            if options["remove"]:
                firewall.remove()
                self.stdout.write(f"{bridge.bridge}: rules removed")
                return
            firewall.apply()
        except (NetworkSpecError, FirewallError) as error:
            raise CommandError(f"cannot fence this Swarm host: {error}") from None
        reach = "the internet" if bridge.internet else "nothing outside"
        self.stdout.write(
            f"{bridge.bridge}: containers reach the hub at {bridge.hub_url} and {reach}; "
            f"only {bridge.hub_address} opens connections to their ports"
        )
