"""The database's clock: what billing charges by and what proofs of life are stamped with, whatever the clock of
the process asking says (processes on several hosts, or a worker whose clock runs ahead, read the same).

A test that drives time through months (billing's property test) stops this clock at moments of its choosing
(``stop_at``): every reader of it then gets that moment, the meter's statements included. Nothing else sets it.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

_stopped: list[datetime | None] = [None]


def database_now() -> datetime:
    """The database's now (the transaction's start, on PostgreSQL)."""
    if _stopped[0] is not None:
        return _stopped[0]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT now()")
            moment: datetime = cursor.fetchone()[0]
            return moment
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        text = cursor.fetchone()[0]
    return datetime.fromisoformat(f"{text}+00:00")


def stopped() -> datetime | None:
    """The moment a test stopped the clock at, if one did."""
    return _stopped[0]


def stop_at(moment: datetime | None) -> None:
    """For tests that drive time: every reader of this clock gets ``moment`` until the next call (None: the
    database's own again)."""
    _stopped[0] = moment
