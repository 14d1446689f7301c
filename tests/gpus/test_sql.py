"""The allocator's own way to PostgreSQL (``sessions.gpus.sql``): values both ways, errors, prepared statements."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, IntegrityError, ProgrammingError, connection, transaction

from sessions.gpus import sql

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the pipeline is PostgreSQL's"),
]
USER = User._meta.db_table


@pytest.fixture
def fresh_wire() -> Iterator[None]:
    """Each test starts on a connection that has prepared nothing of ours (a new pool: the old one's
    connections keep their prepared statements, which is the point of pooling them)."""
    connection.close()
    connection.close_pool()  # type: ignore[attr-defined]
    yield
    connection.close()
    connection.close_pool()  # type: ignore[attr-defined]


def wire() -> sql.Wire:
    return connection.connection.gpu_wire  # type: ignore[no-any-return]


def test_values_go_and_come_back_as_djangos_own_cursors_give_them(fresh_wire: None) -> None:
    moment = datetime.datetime(2026, 11, 30, 12, 0, 5, 250000, tzinfo=datetime.UTC)
    big, text, missing = 2**40, "O'Brien; DROP TABLE x; -- %s", None
    rows = sql.one(
        "SELECT %s::bigint, %s::int, %s::text, %s::text IS NULL, %s::timestamptz, %s::double precision,"
        " %s::boolean, %s::jsonb -> 'a', '100%%'",
        [big, 7, text, missing, moment, 1.5, True, '{"a": [1, 2]}'],
    )
    # JSON comes back as text: Django's JSONField decodes it itself.
    assert rows == [(big, 7, text, True, moment, 1.5, True, "[1, 2]", "100%")]
    assert sql.one("SELECT id FROM auth_user WHERE id = %s", [-1]) == []


def test_a_batch_is_one_round_trip_in_order_each_statement_on_its_own_snapshot(fresh_wire: None) -> None:
    first, second, third = sql.batch(
        (
            f"INSERT INTO {USER} (username, password, is_superuser, is_staff, is_active, first_name, last_name,"
            " email, date_joined) VALUES (%s, '', false, false, true, '', '', '', now()) RETURNING id",
            ["piped"],
        ),
        (f"SELECT username FROM {USER} WHERE username = %s", ["piped"]),  # sees the row inserted before it
        (f"UPDATE {USER} SET first_name = %s WHERE username = %s", ["Pip", "piped"]),
    )
    assert len(first) == 1 and second == [("piped",)] and third == []
    assert User.objects.get(username="piped").first_name == "Pip"


def test_a_failing_statement_raises_djangos_error_and_undoes_its_whole_batch(fresh_wire: None) -> None:
    User.objects.create_user("taken")
    with pytest.raises(IntegrityError, match="duplicate key"):
        sql.batch(
            (f"UPDATE {USER} SET first_name = 'before' WHERE username = %s", ["taken"]),
            (
                f"INSERT INTO {USER} (username, password, is_superuser, is_staff, is_active, first_name, last_name,"
                " email, date_joined) VALUES (%s, '', false, false, true, '', '', '', now())",
                ["taken"],
            ),
            (f"UPDATE {USER} SET last_name = 'after' WHERE username = %s", ["taken"]),
        )
    taken = User.objects.get(username="taken")
    # Up to its Sync a pipeline is one transaction: the statement before the error is undone, the one after never ran.
    assert (taken.first_name, taken.last_name) == ("", "")
    assert sql.one("SELECT 1", []) == [(1,)]  # the connection is still good


def test_an_error_inside_our_transaction_undoes_all_of_it(fresh_wire: None) -> None:
    with pytest.raises(DatabaseError), sql.transaction():
        sql.batch((f"UPDATE {USER} SET first_name = 'gone' WHERE username = %s", ["nobody"]))
        User.objects.create_user("inside")
        sql.batch(("SELECT 1 / 0", []), commit=True)
    assert not User.objects.filter(username="inside").exists()
    assert connection.get_autocommit() and sql.one("SELECT 2", []) == [(2,)]


def test_statements_are_prepared_once_per_connection_and_a_bad_one_is_not_remembered(fresh_wire: None) -> None:
    query = f"SELECT count(*) FROM {USER} WHERE id > %s"
    assert sql.one(query, [0]) == [(0,)]
    prepared = set(wire().prepared)
    assert len(prepared) == 1
    assert sql.one(query, [5]) == [(0,)]
    assert wire().prepared == prepared  # the same text and types: the same statement
    names = {name for (name,) in sql.one("SELECT name FROM pg_prepared_statements", [])}
    assert {name.decode() for name in wire().prepared} == names  # that query is one of ours too
    before = set(wire().prepared)
    with pytest.raises(ProgrammingError, match="no_such_table"):
        sql.one("SELECT * FROM no_such_table WHERE id = %s", [1])
    assert wire().prepared == before  # its PREPARE failed: not remembered, so a later try prepares again
    connection.close()
    connection.close_pool()  # type: ignore[attr-defined]  # a new connection (not one back from the pool)
    assert sql.one(query, [0]) == [(0,)]
    assert len(wire().prepared) == 1  # prepares again


def test_with_prepared_statements_off_nothing_is_prepared(fresh_wire: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_SQL_PREPARED = False
    assert sql.batch(("SELECT %s::int + 1", [1]), ("SELECT %s::text", ["x"])) == [[(2,)], [("x",)]]
    assert wire().prepared == set()
    assert sql.one("SELECT count(*) FROM pg_prepared_statements", []) == [(0,)]


def test_a_value_that_cannot_be_sent_sends_nothing_and_keeps_the_connection(fresh_wire: None) -> None:
    User.objects.create_user("kept")
    raw = connection.connection
    with pytest.raises(ProgrammingError, match="cannot adapt"):
        sql.batch((f"UPDATE {USER} SET first_name = 'sent' WHERE id > %s", [0]), ("SELECT %s", [object()]))
    assert connection.connection is raw and not raw.closed
    assert User.objects.get(username="kept").first_name == ""
    assert sql.one("SELECT 2", []) == [(2,)]


def test_a_batch_that_opens_a_django_atomic_block_belongs_to_it(fresh_wire: None) -> None:
    """Django's outermost atomic block starts no transaction until its first query: ours must start it."""
    with pytest.raises(RuntimeError, match="on purpose"), transaction.atomic():
        sql.batch(
            (
                f"INSERT INTO {USER} (username, password, is_superuser, is_staff, is_active, first_name, last_name,"
                " email, date_joined) VALUES (%s, '', false, false, true, '', '', '', now())",
                ["rolled-back"],
            )
        )
        assert User.objects.filter(username="rolled-back").exists()
        raise RuntimeError("on purpose")
    assert not User.objects.filter(username="rolled-back").exists()
    assert connection.get_autocommit() and sql.one("SELECT 3", []) == [(3,)]
