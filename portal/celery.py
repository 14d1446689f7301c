"""The Celery app: Redis broker, tasks found in every installed app.

The beat schedule lives here and only here (issues add entries to it).
"""

import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

app.conf.beat_schedule = {
    "portal-heartbeat": {"task": "portal.tasks.record_heartbeat", "schedule": 60.0},
    "sync-gpus": {"task": "sessions.tasks.sync_gpus", "schedule": 300.0},
    "reconcile-sessions": {"task": "sessions.tasks.reconcile_sessions", "schedule": 20.0},
    "cull-idle-sessions": {"task": "sessions.tasks.cull_idle_sessions", "schedule": 60.0},
    "prune-gpu-history": {"task": "sessions.tasks.prune_gpu_history", "schedule": 3600.0},
}


@worker_ready.connect
def announce_worker(**kwargs: Any) -> None:
    """Report in at start, so staff need not wait for beat's first minute."""
    from portal.tasks import record_heartbeat

    record_heartbeat.delay()
