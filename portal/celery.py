"""The Celery app: Redis broker, tasks found in every installed app.

The beat schedule lives here and only here (issues add entries to it).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

app.conf.beat_schedule = {
    "portal-heartbeat": {"task": "portal.tasks.record_heartbeat", "schedule": 60.0},
}
