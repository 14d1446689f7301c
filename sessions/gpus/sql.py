"""Plain SQL for the allocator's hot path: fewer round trips than the ORM needs.

Allocating and releasing a slice is a handful of short statements; on a
fleet of a thousand GPUs each round trip to PostgreSQL costs more than the
placement decision itself. ``batch`` sends statements that do not depend on
each other's results in one round trip where the database allows it
(PostgreSQL with client-side binding, Django's default) and one by one
elsewhere (SQLite). Every statement still runs on its own snapshot, so a
count after a row lock sees what the lock waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection

Statement = tuple[str, Sequence[Any]]
Rows = list[tuple[Any, ...]]


def for_update(of: str = "", skip_locked: bool = False) -> str:
    """The row-locking clause this database understands, or nothing (SQLite locks the whole file)."""
    features = connection.features
    if not features.has_select_for_update:
        return ""
    clause = " FOR UPDATE"
    if of and features.has_select_for_update_of:
        clause += f" OF {of}"
    if skip_locked and features.has_select_for_update_skip_locked:
        clause += " SKIP LOCKED"
    return clause


def _batches() -> bool:
    options = connection.settings_dict.get("OPTIONS", {})
    return connection.vendor == "postgresql" and not options.get("server_side_binding")


def batch(*statements: Statement) -> list[Rows]:
    """Run the statements in order; return each one's rows (empty for those that return none)."""
    results: list[Rows] = []
    with connection.cursor() as cursor:
        if _batches() and len(statements) > 1:
            cursor.execute(";\n".join(sql for sql, _ in statements), [p for _, params in statements for p in params])
            while True:
                results.append(list(cursor.fetchall()) if cursor.description else [])
                if not cursor.nextset():
                    break
            return results
        for sql, params in statements:
            cursor.execute(sql, params)
            results.append(list(cursor.fetchall()) if cursor.description else [])
    return results


def one(sql: str, params: Sequence[Any]) -> Rows:
    return batch((sql, params))[0]
