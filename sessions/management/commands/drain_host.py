"""Drain a GPU host from a shell, as the fleet page's button does: nothing new is placed there, what runs there
runs on to its end; ``--undo`` brings it back into placement. For operators and scripts (a host to be
serviced, docs/operating.md); the note on the host names the staff member it is done for."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal.env import Env
from sessions.gpus import hosts
from sessions.gpus.models import GpuHost, Slice


class Command(BaseCommand):
    help = "Take a GPU host out of placement (what runs there runs on); --undo brings it back."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("host", help="the GPU host's name, as the fleet page shows it")
        parser.add_argument("--undo", action="store_true", help="take new work there again")
        parser.add_argument(
            "--by", default=Env().text("PORTAL_ADMIN_USERNAME", "admin"), help="the staff member it is done for"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host = GpuHost.objects.filter(name=options["host"]).first()
        if host is None:
            known = ", ".join(GpuHost.objects.order_by("name").values_list("name", flat=True)) or "none"
            raise CommandError(f"no GPU host is named {options['host']!r} (the hosts: {known})")
        by = User.objects.filter(username=options["by"], is_staff=True, is_active=True).first()
        if by is None:
            raise CommandError(f"{options['by']!r} is not an active staff member (--by)")
        try:
            host = hosts.resume(host.pk, by) if options["undo"] else hosts.drain(host.pk, by)
        except hosts.HostRefused as error:
            raise CommandError(str(error)) from None
        if options["undo"]:
            self.stdout.write(f"{host.name} takes new work again ({host.state})")
            return
        held = Slice.objects.filter(gpu__host=host, released_at__isnull=True).count()
        self.stdout.write(f"{host.name}: {host.drained} Slices still held there: {held}.")
