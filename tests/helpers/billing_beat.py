"""A real Celery beat process that sends only billing's entries of the real schedule (the minute tick, by
default), each every ``argv[1]`` seconds so a test sees many in a few seconds, its schedule kept in
``argv[2]``; further arguments name the entries (``billing-minute``, ``billing-credit``). Their pace in
production (60 s, 30 s) is pinned by tests/billing/test_tasks.py.

Run as ``python -m tests.helpers.billing_beat SECONDS SCHEDULE_FILE [ENTRY ...]`` with the helper processes'
environment.
"""

from __future__ import annotations

import sys

import django


def main(every: float, schedule: str, entries: list[str]) -> None:
    django.setup()
    from portal.celery import app

    wanted = {name: {**app.conf.beat_schedule[name], "schedule": every} for name in entries}
    app.conf.beat_schedule = wanted
    app.Beat(schedule=schedule, loglevel="INFO", pidfile=None).run()


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2], sys.argv[3:] or ["billing-minute"])
