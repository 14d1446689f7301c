"""What a portal needs once before its programs start: migrations, the first administrator, the hub's OAuth
client and the notebook image on offer, under one lock, so several containers starting at once (web replicas,
a stack's set-up service run again) do it one after another, and every one after the first finds nothing
left to do.

With ``--await`` it changes nothing and waits until a set-up has been done: the database answers, every
migration is applied and the hub's client exists. Programs started by ``docker stack deploy``, which has no
start order, wait so before they start (compose/images/portal/entrypoint)."""

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
from django.db import DatabaseError, OperationalError, connection
from django.db.migrations.executor import MigrationExecutor
from oauth2_provider.models import get_application_model

from portal.sso.clients import HUB_CLIENT_ID

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


def set_up() -> str:
    """What a set-up has yet to do, or "" when it is done."""
    executor = MigrationExecutor(connection)
    waiting = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if waiting:
        return f"{len(waiting)} migrations to apply"
    if not get_application_model().objects.filter(client_id=HUB_CLIENT_ID).exists():
        return "the hub's OAuth client to register"
    return ""


def await_set_up(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    left = "the database to answer"
    while time.monotonic() < deadline:
        try:
            left = set_up()
            if not left:
                return
        except DatabaseError as error:
            left = f"the database ({error})".strip()
            connection.close()
        time.sleep(1)
    raise CommandError(f"no set-up within {seconds:.0f} s; still waiting for {left}")


class Command(BaseCommand):
    help = (
        "Migrate, create the first administrator, register the hub's OAuth client and offer the notebook image, "
        "once, under a lock."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--wait", type=float, default=60, help="Seconds to wait for the database (60).")
        parser.add_argument(
            "--await", dest="await_only", action="store_true", help="Change nothing; wait until a set-up is done."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["await_only"]:
            await_set_up(options["wait"])
            return
        wait_for_database(options["wait"])
        with held_lock():
            call_command("migrate", interactive=False, verbosity=1)
            call_command("bootstrap_admin")
            call_command("register_hub_client")
            call_command("ensure_notebook_image")
        self.stdout.write("setup: done")
