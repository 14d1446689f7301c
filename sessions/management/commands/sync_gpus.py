"""Discover this host's GPUs (or the simulated fleet) and record them."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from sessions.gpus import agency
from sessions.gpus.backends import get_backend
from sessions.gpus.fleet import sync_fleet


class Command(BaseCommand):
    help = "Discover GPUs through the configured backend and record hosts, GPUs and MIG instances."

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_backend()
        # Run by hand on the host (or by make run before its agent starts): it acts as the host's agent.
        with agency.acting_for(agency.hosts_of_this_machine()):
            found = sync_fleet(backend)
        for host in found:
            gpus = list(host.gpus.all())
            kinds = ", ".join(f"{gpu.index}: {gpu.model_name} ({gpu.get_sharing_display()})" for gpu in gpus)
            label = "simulated " if host.simulated else ""
            self.stdout.write(f"gpus: {label}host {host.name}: {len(gpus)} GPU(s) [{kinds}]")
