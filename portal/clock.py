"""The database's clock: what billing charges by and what proofs of life are stamped with, whatever the clock of
the process asking says (processes on several hosts, or a worker whose clock runs ahead, read the same)."""

from __future__ import annotations

from datetime import datetime

from django.db import connection


def database_now() -> datetime:
    """The database's now (the transaction's start, on PostgreSQL)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT now()")
            moment: datetime = cursor.fetchone()[0]
            return moment
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        text = cursor.fetchone()[0]
    return datetime.fromisoformat(f"{text}+00:00")
