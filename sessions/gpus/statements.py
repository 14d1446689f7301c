"""Small statements that reach the database together, each planned once per connection.

An allocation and a release are a handful of small statements. Sent one at a time, each costs a
round trip and a fresh plan. Here they go through psycopg's own pipeline (the statements of one
``together()`` block reach PostgreSQL in one round trip, its transaction's BEGIN included) on a
server-side binding cursor, which psycopg prepares from a statement's fifth use on a connection
(its ``prepare_threshold``, which settings.py turns on; Django leaves it off). Measured on 1,000
GPUs, allocate+release on the launch path: p50 13-15 ms planned each time, 10-11 ms prepared
(bench/results/notes.md, issue 12).

They run on Django's connection, inside the caller's transaction, through Django's cursor
wrapper, so its execute wrappers and query log see every one. SQLite runs each at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper


class Queued:
    """A statement handed to the database; its rows once its ``together()`` block has ended (or now, which
    sends everything queued before it)."""

    def __init__(self, cursor: CursorWrapper) -> None:
        self._cursor = cursor

    def rows(self) -> list[tuple[Any, ...]]:
        """Its rows; only for a statement that returns rows (a SELECT, a RETURNING)."""
        return list(self._cursor.fetchall())

    @property
    def returned_rows(self) -> bool:
        """Whether it returned rows (known once its block has ended)."""
        return self._cursor.description is not None


def queue(sql: str, params: Sequence[Any] = ()) -> Queued:
    """Hand ``sql`` to the database: at once, or in a ``together()`` block with the block's other statements."""
    cursor = _cursor()
    cursor.execute(sql, params)
    return Queued(cursor)


def rows(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run ``sql`` and return its rows now."""
    return queue(sql, params).rows()


def run(*statements: tuple[str, Sequence[Any]]) -> list[list[tuple[Any, ...]]]:
    """Run the statements in order, in one round trip on PostgreSQL, and return the rows of each (empty for a
    statement that returns none). Each sees what the ones before it did and, in READ COMMITTED, what others
    committed before it began: a lock one takes holds for the reads of the next."""
    if len(statements) == 1:  # one round trip anyway; a pipeline of one only adds its own messages
        queued = [queue(*statements[0])]
    else:
        with together():
            queued = [queue(sql, params) for sql, params in statements]
    return [item.rows() if item.returned_rows else [] for item in queued]


@contextmanager
def together() -> Iterator[None]:
    """Statements queued in the block, and whatever else runs on the connection meanwhile (a simulated
    driver's own), reach PostgreSQL together when the block ends. Reading a statement's rows inside the
    block sends what was queued so far and waits for it: one more round trip."""
    db = _db()
    if db.vendor != "postgresql":
        yield  # SQLite runs each statement at once
        return
    db.ensure_connection()
    if db.connection.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF:
        yield  # a block inside a block: the outer one sends it all
        return
    with db.wrap_database_errors, db.connection.pipeline():
        yield


def insert(row: models.Model, **sql: str) -> tuple[str, list[Any]]:
    """The INSERT ... RETURNING id for an unsaved row; ``sql`` gives a field an SQL expression of no parameter."""
    columns, marks, values = row_values(row, **sql)
    return f"INSERT INTO {row._meta.db_table} ({columns}) VALUES ({marks}) RETURNING id", values  # noqa: S608


def row_values(row: models.Model, **sql: str) -> tuple[str, str, list[Any]]:
    """An unsaved row's columns, their placeholders (or ``sql``'s expressions) and its values, as an INSERT
    takes them: every concrete field but the primary key, each value as the field saves it."""
    fields, columns = _insert_columns(type(row))
    db = _db()
    marks, values = [], []
    for field in fields:
        if field.name in sql:
            marks.append(sql[field.name])
        else:
            marks.append("%s")
            values.append(field.get_db_prep_save(field.pre_save(row, add=True), db))
    return columns, ", ".join(marks), values


@cache
def _insert_columns(model: type[models.Model]) -> tuple[list[Any], str]:
    fields = [field for field in model._meta.concrete_fields if not field.primary_key]
    return fields, ", ".join(field.column for field in fields)


def database() -> BaseDatabaseWrapper:
    """The connection these statements run on, for preparing values (``Field.get_db_prep_save``)."""
    return _db()


def _db() -> BaseDatabaseWrapper:
    """The default database's wrapper itself: each attribute read through ``django.db.connection`` costs
    a lookup of the thread's connection, and a statement reads a dozen of them."""
    return connections[DEFAULT_DB_ALIAS]


def _cursor() -> CursorWrapper:
    """A cursor of Django's on its connection: server-side binding on PostgreSQL (so psycopg prepares what
    repeats, from ``prepare_threshold`` uses on a connection; settings.py), Django's own elsewhere."""
    db = _db()
    if db.vendor != "postgresql":
        return db.cursor()
    db.ensure_connection()
    db.validate_thread_sharing()
    cursor = psycopg.Cursor(db.connection)
    # django-stubs types the argument as Django's own wrapper; Django passes the driver's cursor, as here.
    return _LoggedCursor(cursor, db) if db.queries_logged else db.make_cursor(cursor)  # type: ignore[arg-type]


class _LoggedCursor(CursorDebugWrapper):
    """Django's query log (DEBUG, tests' query counts) with each statement's text and values.

    Django reads a statement back from the driver, which keeps none for a prepared one: here the log
    gets the statement with its values bound the way Django's own cursors would have sent it.
    """

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.debug_sql(self.db.ops.compose_sql(sql, params)):
            return CursorWrapper.execute(self, sql, params)
