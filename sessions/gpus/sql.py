"""Plain SQL for the allocator's hot path: fewer round trips than the ORM needs.

Allocating and releasing a slice is a handful of short statements; on a
fleet of a thousand GPUs each round trip to PostgreSQL costs more than the
placement decision itself. ``batch`` sends statements that do not depend on
each other's results in one round trip on PostgreSQL (libpq's pipeline mode,
each statement prepared once per connection) and one by one elsewhere
(SQLite). Every statement still runs on its own snapshot, so a count after a
row lock sees what the lock waited for; outside a transaction a batch is one
implicit transaction of its own, all or nothing.

``transaction`` goes one step further on PostgreSQL: its BEGIN travels with
the first batch and its COMMIT with the last, where a Django atomic block
would spend a round trip on each.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import select
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db import transaction as django_transaction
from psycopg import pq
from psycopg.adapt import PyFormat

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
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


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
    """PostgreSQL: every statement in one round trip, through libpq's pipeline mode, each one prepared.

    psycopg's own pipeline writes and reads after every statement, with a
    cursor each: about 0.4 ms of client CPU per allocate+release pair, a
    third of it. Here the statements queue in libpq, leave in one write with
    one Sync, and then every result is read (``Wire``).
    """
    db = connections[DEFAULT_DB_ALIAS]  # one look-up of this thread's connection, not one per attribute
    db.ensure_connection()
    raw = db.connection
    wire = getattr(raw, "gpu_wire", None)
    if wire is None:
        wire = raw.gpu_wire = Wire(raw, prepare=settings.GPU_SQL_PREPARED)
    # Django's outermost atomic block turns psycopg's autocommit off and leaves the BEGIN to
    # psycopg's next query; when that query is ours, the BEGIN has to come from us.
    begin = not raw.autocommit and raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
    with db.wrap_database_errors, raw.lock:
        if begin:
            return wire.run([(_begin(raw), []), *statements])[1:]
        return wire.run(statements)


def _begin(raw: psycopg.Connection[Any]) -> str:
    """The BEGIN psycopg would send on this connection: its isolation level, read-only and deferrable settings."""
    command = "BEGIN"
    if raw.isolation_level is not None:
        command += f" ISOLATION LEVEL {raw.isolation_level.name.replace('_', ' ')}"
    if raw.read_only is not None:
        command += " READ ONLY" if raw.read_only else " READ WRITE"
    if raw.deferrable is not None:
        command += " DEFERRABLE" if raw.deferrable else " NOT DEFERRABLE"
    return command


class Wire:
    """Statements sent on one psycopg connection's libpq connection, with psycopg's adapters for the values.

    A statement is prepared on its first use on the connection (unless
    ``PORTAL_DB_PREPARED=0``), which saves its planning on every later call.
    A failing statement makes the server skip those after it (up to the
    Sync); its error is raised as psycopg's class for its SQLSTATE. Anything
    else going wrong on the wire closes the connection, as Django then
    expects of a broken one.
    """

    def __init__(self, raw: psycopg.Connection[Any], prepare: bool) -> None:
        self.raw, self.pgconn, self.prepare = raw, raw.pgconn, prepare
        self.dumpers: dict[type, Any] = {}
        self.loaders: dict[int, Any] = {}
        self.prepared: set[bytes] = set()

    def run(self, statements: list[Statement]) -> list[Rows]:
        dumped = [(sql, *self._dump(params)) for sql, params in statements]  # a value we cannot send: nothing sent
        pgconn = self.pgconn
        preparing: list[bytes | None] = []  # per result before the Sync: the name being prepared, or None
        try:
            pgconn.enter_pipeline_mode()
            for sql, values, types in dumped:
                if self.prepare:
                    name = _name(sql, tuple(types))
                    if name not in self.prepared:
                        pgconn.send_prepare(name, _numbered(sql), types)
                        preparing.append(name)
                    pgconn.send_query_prepared(name, values)
                else:
                    pgconn.send_query_params(_numbered(sql), values, types)
                preparing.append(None)
            pgconn.pipeline_sync()
            results = self._exchange()
            pgconn.exit_pipeline_mode()
        except BaseException:
            self.raw.close()
            raise
        rows: list[Rows] = []
        error: psycopg.Error | None = None
        for made, result in zip(preparing, results, strict=True):
            if result.status == pq.ExecStatus.FATAL_ERROR and error is None:
                error = _error(result)
            if made is not None:
                if result.status == pq.ExecStatus.COMMAND_OK:
                    self.prepared.add(made)
            else:
                rows.append(self._load(result) if result.status == pq.ExecStatus.TUPLES_OK else [])
        if error is not None:
            raise error
        return rows

    def _exchange(self) -> list[pq.abc.PGresult]:
        """Send what libpq holds, then read every result up to the Sync."""
        pgconn, socket = self.pgconn, self.pgconn.socket
        while pgconn.flush():  # more to send: wait until the socket takes it, reading meanwhile
            if _wait(socket, select.POLLIN | select.POLLOUT) & select.POLLIN:
                pgconn.consume_input()
        results: list[pq.abc.PGresult] = []
        while True:
            while pgconn.is_busy():
                _wait(socket, select.POLLIN)
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one statement's results
            if result.status == pq.ExecStatus.PIPELINE_SYNC:
                return results
            results.append(result)

    def _dump(self, params: Sequence[Any]) -> tuple[list[bytes | None], list[int]]:
        values: list[bytes | None] = []
        types: list[int] = []
        for value in params:
            if value is None:
                values.append(None)
                types.append(0)
                continue
            dumper = self.dumpers.get(type(value))
            if dumper is None:
                found = self.raw.adapters.get_dumper(type(value), PyFormat.TEXT)
                dumper = self.dumpers[type(value)] = found(type(value), self.raw)
            dumper = dumper.upgrade(value, PyFormat.TEXT)  # e.g. the integer dumper fitting this value
            dumped = dumper.dump(value)
            values.append(None if dumped is None else bytes(dumped))
            types.append(dumper.oid)
        return values, types

    def _load(self, result: pq.abc.PGresult) -> Rows:
        loads = []
        for column in range(result.nfields):
            oid = result.ftype(column)
            loader = self.loaders.get(oid)
            if loader is None:
                adapters = self.raw.adapters
                found = adapters.get_loader(oid, pq.Format.TEXT) or adapters.get_loader(0, pq.Format.TEXT)
                loader = self.loaders[oid] = found(oid, self.raw)  # type: ignore[misc]
            loads.append(loader.load)
        return [
            tuple(
                None if (value := result.get_value(row, column)) is None else load(value)
                for column, load in enumerate(loads)
            )
            for row in range(result.ntuples)
        ]


def _wait(socket: int, events: int) -> int:
    poller = select.poll()
    poller.register(socket, events)
    return poller.poll()[0][1]


def _error(result: pq.abc.PGresult) -> psycopg.Error:
    state = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    message = (result.error_message or b"").decode(errors="replace").strip()
    try:
        return psycopg.errors.lookup(state)(message)
    except KeyError:
        return psycopg.DatabaseError(message)


@functools.lru_cache(maxsize=512)
def _numbered(sql: str) -> bytes:
    """The statement with PostgreSQL's $1, $2 ... where it has %s (and % where it has %%)."""
    counter = itertools.count(1)
    return re.sub(r"%([s%])", lambda match: f"${next(counter)}" if match[1] == "s" else "%", sql).encode()


@functools.lru_cache(maxsize=512)
def _name(sql: str, types: tuple[int, ...]) -> bytes:
    """A prepared statement's name: the same text with the same parameter types, the same name."""
    return b"gpu_" + hashlib.blake2b(f"{types}{sql}".encode(), digest_size=10).hexdigest().encode()


def _one_by_one(statements: list[Statement]) -> list[Rows]:
    results: list[Rows] = []
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params)
            results.append(list(cursor.fetchall()) if cursor.description else [])
    return results


def one(sql: str, params: Sequence[Any]) -> Rows:
    return batch((sql, params))[0]
