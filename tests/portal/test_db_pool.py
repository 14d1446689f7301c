"""The pool of PostgreSQL connections after the server ended them (a restart, an operator's
pg_terminate_backend): a dead connection is never lent, so no request fails for it."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from tests.helpers import processes

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(processes.test_database_url().startswith("sqlite"), reason="PostgreSQL's pool"),
]


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_a_connection_the_server_ended_is_not_lent_again() -> None:
    assert getattr(connection, "pool", None) is not None, "the test database runs with the pool, as the portal does"
    pids = set()
    for _ in range(3):  # the pool's idle connections, each back in the pool
        pids.add(backend_pid())
        connection.close()
    settings = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in settings.items() if k != "prepare_threshold"}, autocommit=True) as other:
        for pid in pids:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
    assert backend_pid() not in pids  # a fresh connection, not an error
