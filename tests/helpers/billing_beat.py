"""A real Celery beat process that sends only the billing minute (beat's own scheduler, the real schedule
entry), every ``argv[1]`` seconds so a test sees many ticks in a few seconds, its schedule kept in
``argv[2]``. The entry's pace itself, every 60 s, is pinned by tests/billing/test_tasks.py.

Run as ``python -m tests.helpers.billing_beat SECONDS SCHEDULE_FILE`` with the helper processes' environment.
"""

from __future__ import annotations

import sys

import django


def main(every: float, schedule: str) -> None:
    django.setup()
    from portal.celery import app

    entry = {**app.conf.beat_schedule["billing-minute"], "schedule": every}
    app.conf.beat_schedule = {"billing-minute": entry}
    app.Beat(schedule=schedule, loglevel="INFO", pidfile=None).run()


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2])
