"""What a portal needs once before its programs start: migrations, the first administrator and the hub's OAuth
client, under one lock, so several containers starting at once (web replicas, a stack's set-up service run
again) do it one after another, and every one after the first finds nothing left to do."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError, connection

# pg_advisory_lock's key: any number no other part of the portal takes ("GPUP" in ASCII).
LOCK_KEY = 0x47505550


@contextlib.contextmanager
def held_lock() -> Iterator[None]:
    """The database's advisory lock on PostgreSQL (every container sees it); a file lock on SQLite (one host)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
            try:
                yield
            finally:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
        return
    path = Path(settings.DATA_DIR) / "setup.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def wait_for_database(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            connection.ensure_connection()
            return
        except OperationalError as error:
            if time.monotonic() > deadline:
                raise CommandError(f"the database did not answer within {seconds:.0f} s: {error}") from None
            connection.close()
            time.sleep(1)


class Command(BaseCommand):
    help = "Migrate, create the first administrator and register the hub's OAuth client, once, under a lock."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--wait", type=float, default=60, help="Seconds to wait for the database (60).")

    def handle(self, *args: Any, **options: Any) -> None:
        wait_for_database(options["wait"])
        with held_lock():
            call_command("migrate", interactive=False, verbosity=1)
            call_command("bootstrap_admin")
            call_command("register_hub_client")
        self.stdout.write("setup: done")
