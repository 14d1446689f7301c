"""Plain SQL for the allocator's hot path: fewer round trips than the ORM needs.

Allocating and releasing a slice is a handful of short statements; on a
fleet of a thousand GPUs each round trip to PostgreSQL costs more than the
placement decision itself. ``batch`` sends statements that do not depend on
each other's results in one round trip where the database allows it
(PostgreSQL with client-side binding, Django's default) and one by one
elsewhere (SQLite). Every statement still runs on its own snapshot, so a
count after a row lock sees what the lock waited for.

``transaction`` goes one step further on PostgreSQL: its BEGIN travels with
the first batch and its COMMIT with the last, where a Django atomic block
would spend a round trip on each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db import transaction as django_transaction

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
    db = connections[DEFAULT_DB_ALIAS]
    return db.vendor == "postgresql" and not db.settings_dict.get("OPTIONS", {}).get("server_side_binding")


class Transaction:
    """State of one ``transaction()`` block: whether BEGIN is still to be sent, whether it has committed."""

    def __init__(self, manual: bool) -> None:
        self.manual = manual
        self.begin_pending = manual
        self.committed = False

    def begin_first(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        """Django execute wrapper: a query not sent through ``batch`` still runs inside the transaction."""
        if self.committed:
            raise RuntimeError("a query ran after this transaction's COMMIT")
        if self.begin_pending:
            self.begin_pending = False
            context["cursor"].cursor.execute("BEGIN")
        return execute(sql, params, many, context)


_current: ContextVar[Transaction | None] = ContextVar("gpu_sql_transaction", default=None)


@contextmanager
def transaction() -> Iterator[Transaction]:
    """One transaction, as ``django.db.transaction.atomic`` would give, in two round trips fewer.

    On PostgreSQL in autocommit mode (outside any atomic block) the BEGIN is
    sent with the block's first batch and the COMMIT with the batch marked
    ``commit=True`` (or alone at the end). Django is told a transaction is open
    (its autocommit flag is off while psycopg's stays on), so ORM queries in
    the block, ``select_for_update`` included, run inside it and nested atomic
    blocks become savepoints instead of committing. Elsewhere (SQLite, inside
    an atomic block) this is a plain atomic block.
    """
    if not _batches() or connection.in_atomic_block or not connection.get_autocommit():
        with django_transaction.atomic():
            state = Transaction(manual=False)
            token = _current.set(state)
            try:
                yield state
            finally:
                _current.reset(token)
        return
    state = Transaction(manual=True)
    token = _current.set(state)
    connection.autocommit = False
    try:
        with connection.execute_wrapper(state.begin_first):
            yield state
        if not state.committed and not state.begin_pending:
            connection.connection.execute("COMMIT")
            state.committed = True
    except BaseException:
        if not state.committed and not state.begin_pending:
            _rollback()
        raise
    finally:
        _current.reset(token)
        connection.autocommit = True
        connection.needs_rollback = False


def manual() -> bool:
    """Whether the current ``transaction()`` block is our own (outermost, on PostgreSQL)."""
    state = _current.get()
    return state is not None and state.manual


def _rollback() -> None:
    try:
        connection.connection.execute("ROLLBACK")
    except Exception:  # the connection is unusable; Django opens a new one on next use
        connection.close()


def batch(*statements: Statement, commit: bool = False) -> list[Rows]:
    """Run the statements in order; return each one's rows (empty for those that return none).

    Inside ``transaction()``, the first batch carries the BEGIN; ``commit=True``
    marks the block's last batch, which then carries the COMMIT.
    """
    state = _current.get()
    begin = state is not None and state.begin_pending
    commit = commit and state is not None and state.manual
    sent: list[Statement] = ([("BEGIN", [])] if begin else []) + list(statements) + ([("COMMIT", [])] if commit else [])
    if state is not None:
        state.begin_pending = False
    results = _pipelined(sent) if _batches() else _one_by_one(sent)
    if commit and state is not None:
        state.committed = True
    return results[1 if begin else 0 : len(results) - 1 if commit else None]


def _pipelined(statements: list[Statement]) -> list[Rows]:
    """PostgreSQL: every statement in one round trip (psycopg's pipeline mode), each one prepared.

    Server-side binding lets psycopg prepare each statement (``PORTAL_DB_PREPARED``),
    which saves the planning on every later call; the pipeline sends them all
    before reading any result. A failing statement skips those after it and its
    error is raised here, as Django's own error class.
    """
    db = connections[DEFAULT_DB_ALIAS]  # one look-up of this thread's connection, not one per attribute
    db.ensure_connection()
    raw = db.connection
    cursors = []
    with db.wrap_database_errors:
        if len(statements) == 1:  # nothing to pipeline: a plain round trip costs less
            cursor = psycopg.Cursor(raw)
            cursor.execute(*statements[0])
            return [list(cursor.fetchall()) if cursor.description else []]
        with raw.pipeline():
            for sql, params in statements:
                cursor = psycopg.Cursor(raw)
                cursor.execute(sql, params)
                cursors.append(cursor)
        return [list(cursor.fetchall()) if cursor.description else [] for cursor in cursors]


def _one_by_one(statements: list[Statement]) -> list[Rows]:
    results: list[Rows] = []
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params)
            results.append(list(cursor.fetchall()) if cursor.description else [])
    return results


def one(sql: str, params: Sequence[Any]) -> Rows:
    return batch((sql, params))[0]
