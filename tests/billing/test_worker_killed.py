"""A real Celery worker killed with SIGKILL in the middle of a tick, and started again: nothing lost,
nothing charged twice, the ledger balanced.

The test holds a row lock the tick needs, so the tick stays inside its transaction, having written
its minute rows, ledger transactions and entries, while the worker is killed. PostgreSQL only:
SQLite has no row locks to hold the tick with.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction

from billing import ledger, money
from billing.models import Account, ChargedMinute, LedgerTransaction, Usage
from billing.tasks import charge_accrued
from tests.billing.conftest import Hold, clock_moves_on, ledger_total, unbalanced_transactions
from tests.helpers import processes
from tests.helpers.waiting import wait_for

pytestmark = [
    pytest.mark.celery,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="row locks hold the tick open"),
]
A100_MINUTE = money.per_minute(Decimal("8.5"))
QUEUE = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-killed"  # its own queue: the session's worker never takes these


def start_worker(name: str) -> subprocess.Popen[bytes]:
    from portal.celery import app

    log = (processes.ROOT / "artifacts" / "logs" / "celery-worker-killed.log").open("ab")
    command = [str(processes.BIN / "celery"), "--app", "portal", "worker", "--pool", "solo", "--queues", QUEUE]
    process = subprocess.Popen(
        [*command, "--hostname", name, "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        cwd=processes.ROOT,
        env=processes.child_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return processes.ready_or_stopped(
        process, lambda: bool(app.control.ping(destination=[name], timeout=0.5)), 60, "worker"
    )


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        processes.stop(process)


def blocked(at_commit: bool) -> list[int]:
    """Backends of this database waiting for a lock: the tick, in its statement or at COMMIT."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND (query = 'COMMIT') = %s AND pid <> pg_backend_pid()",
            [at_commit],
        )
        return [row[0] for row in cursor.fetchall()]


def backend_gone(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0] == 0)


# Where the tick is when its worker dies: inside its one charging statement (it waits to move a usage on;
# nothing commits, the next tick charges it all), or at COMMIT, everything written (the entries' foreign
# keys are checked there; the commit was asked for, so PostgreSQL completes it and the next tick finds
# nothing left). Either way the totals are the same.
@pytest.mark.parametrize(("at_commit", "locked_model", "after_kill"), [(False, Usage, 9), (True, Account, 29)])
def test_a_worker_killed_mid_tick_and_restarted_loses_and_doubles_nothing(
    workers: list[subprocess.Popen[bytes]],
    hold: Hold,
    alice: User,
    bob: User,
    at_commit: bool,
    locked_model: type[Usage | Account],
    after_kill: int,
) -> None:
    hold(alice, timedelta(minutes=5, seconds=30))
    hold(bob, timedelta(minutes=2, seconds=30))
    workers.append(start_worker(f"killed-1-{os.getpid()}@127.0.0.1"))
    assert charge_accrued.apply_async(queue=QUEUE).get(timeout=60)["minutes"] == 6 + 3
    clock_moves_on(10)  # ten more minutes each, for the tick that is killed
    row = locked_model.objects.filter(owner=alice) if locked_model is Usage else Account.objects.filter(user=alice)
    locked, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        try:
            with transaction.atomic():
                list(row.select_for_update())
                locked.set()
                release.wait(60)
        finally:
            connection.close()

    locker = threading.Thread(target=hold_the_row)
    locker.start()
    try:
        assert locked.wait(30)
        charge_accrued.apply_async(queue=QUEUE)
        wait_for(lambda: bool(blocked(at_commit)), 8, "the tick waiting for the row")  # under its 10 s lock timeout
        tick_backend = blocked(at_commit)[0]
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(10)
        assert workers[0].returncode == -signal.SIGKILL
    finally:
        release.set()
        locker.join(30)
    wait_for(lambda: backend_gone(tick_backend), 30, "the killed worker's backend to end")
    assert ChargedMinute.objects.count() == after_kill

    workers.append(start_worker(f"killed-2-{os.getpid()}@127.0.0.1"))
    assert charge_accrued.apply_async(queue=QUEUE).get(timeout=60)["minutes"] == 29 - after_kill
    assert charge_accrued.apply_async(queue=QUEUE).get(timeout=60)["minutes"] == 0  # as a redelivered copy finds
    assert ChargedMinute.objects.count() == 16 + 13 and LedgerTransaction.objects.count() == 4
    assert ledger.balance(alice) == -16 * A100_MINUTE and ledger.balance(bob) == -13 * A100_MINUTE
    assert list(Usage.objects.order_by("owner__username").values_list("billed_minutes", flat=True)) == [16, 13]
    assert ledger_total() == 0 and unbalanced_transactions() == []
