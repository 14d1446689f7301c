"""The Celery app: Redis broker; tasks found beside the services they call.

Each app keeps its tasks in ``tasks.py`` modules next to its services
(``sessions/notebooks/tasks.py``, ``sessions/gpus/tasks.py`` ...); the worker
imports every such module of the project's own apps. The beat schedule lives
here and only here (issues add entries to it).
"""

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from celery.schedules import crontab
from celery.signals import worker_ready
from django.apps import apps
from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger(__name__)

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")


def task_packages() -> list[str]:
    """Every package of the project's own apps that holds a ``tasks`` module (read once the apps are loaded)."""
    packages = []
    for config in apps.get_app_configs():
        folder = Path(config.path)
        if folder.parent != ROOT:
            continue  # Django's and installed packages' apps: the plain autodiscovery below covers them
        for module in sorted(folder.rglob("tasks.py")):
            packages.append(".".join((config.name, *module.parent.relative_to(folder).parts)))
    return packages


app.autodiscover_tasks()
app.autodiscover_tasks(task_packages)

# Render jobs' own queue: a chunk holds its worker thread for as long as Blender renders, so these go to a
# worker of their own (the supervisor's `render` program), never in front of the billing tick or a launch.
# A slice's worker and a host's recovery are sent to the host's own queue by name (sessions/render/queues.py).
RENDER_TASKS = frozenset({"sessions.render.tasks.work_on_slice", "sessions.render.tasks.recover_render_work"})
# The estimate's probe has a lane of its own (the supervisor's `estimate` program): an upload is estimated
# while one person's long job holds every render thread.
ESTIMATE_TASKS = frozenset({"sessions.render.tasks.estimate_job", "sessions.render.tasks.recover_estimates"})


def render_queue(host: str | None = None) -> str:
    """PORTAL_RENDER_QUEUE, else the default queue's name with ``-render`` (a test run's own, say); a GPU host's
    own render queue is that name with ``@<host>``: a slice's worker goes there, to the render worker of that
    host's machine alone (``sessions.render.queues``)."""
    name = str(settings.RENDER_QUEUE or f"{settings.CELERY_TASK_DEFAULT_QUEUE}-render")
    return f"{name}@{host}" if host else name


def estimate_queue() -> str:
    """PORTAL_ESTIMATE_QUEUE, else the default queue's name with ``-estimate``."""
    return str(settings.ESTIMATE_QUEUE or f"{settings.CELERY_TASK_DEFAULT_QUEUE}-estimate")


def route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **extra: Any) -> dict[str, str] | None:
    """Celery's router: the probe to the estimate queue, render work to the render queue, everything else to
    the default one."""
    if name in ESTIMATE_TASKS:
        return {"queue": estimate_queue()}
    return {"queue": render_queue()} if name in RENDER_TASKS else None


app.conf.task_routes = (route,)


def send(name: str, *args: int, noted: Callable[[], object] | None = None, **options: Any) -> None:
    """Hand a task to the broker now (raising if it does not answer); once it took it, ``noted`` records so."""
    app.send_task(name, args=list(args), **options)
    if noted is not None:
        noted()


def send_on_commit(name: str, *args: int, noted: Callable[[], object] | None = None, **options: Any) -> None:
    """Send a task once the step that asks for it commits (at once outside a transaction).

    A broker that does not answer is logged and never undoes the step, nor turns the request into an error
    page. Each task sent so has something that sends it again when it was lost (reconciliation, a sweep, the
    next tick); ``noted`` records that the broker took it, for those that need to know.
    """

    def deliver() -> None:
        try:
            app.send_task(name, args=list(args), **options)
        except BrokerError as error:  # anything else is logged by robust=True, and the step stands all the same
            log.error("task %s%s was not sent (%s); the step stands, to be sent again later", name, list(args), error)
            return
        if noted is not None:
            noted()

    transaction.on_commit(deliver, robust=True)


# No entry carries an expiry: beat stamps it by its own clock and the worker reads it by its own, so a worker
# a minute ahead would drop every one (no charge, no stop at zero, no spot preempted, no render reconciled).
# Every task here is idempotent: those queued while the worker was down run when it is back, the first does
# what is due and the rest find nothing new (billing's ticks return at once beside another: the meter's
# try-lock).
app.conf.beat_schedule = {
    "portal-heartbeat": {"task": "portal.tasks.record_heartbeat", "schedule": 60.0},
    # A host whose agent went silent for PORTAL_HOST_LOST_AFTER_S is lost within this much more.
    "watch-hosts": {"task": "sessions.gpus.tasks.watch_hosts", "schedule": 5.0},
    # Each host's Swarm node as a manager sees it, for the fleet pages (nothing without PORTAL_SWARM_MANAGER).
    "watch-swarm": {"task": "sessions.runtime.tasks.watch_swarm", "schedule": 10.0},
    "reconcile-sessions": {"task": "sessions.notebooks.tasks.reconcile_sessions", "schedule": 20.0},
    "cull-idle-sessions": {"task": "sessions.notebooks.tasks.cull_idle_sessions", "schedule": 60.0},
    "preempt-due-spot": {"task": "sessions.notebooks.tasks.preempt_due_spot", "schedule": 15.0},
    "prune-gpu-history": {"task": "sessions.metrics.tasks.prune_gpu_history", "schedule": 3600.0},
    "render-orphan-uploads": {"task": "sessions.render.tasks.remove_orphan_uploads", "schedule": 3600.0},
    # Ended render jobs' files, PORTAL_RENDER_RETENTION_DAYS after they ended (their records stay).
    "render-retention": {"task": "sessions.render.tasks.remove_expired_render_files", "schedule": 3600.0},
    # Everyone's storage measured again: render jobs' folders, work volumes, notebook containers' own files.
    "measure-storage": {
        "task": "sessions.storage.tasks.measure_storage",
        "schedule": 60.0 * settings.STORAGE_MEASURE_MINUTES,
    },
    # Frees what a crashed render left (slices, containers) and puts chunks whose container is gone back.
    "reconcile-render-jobs": {"task": "sessions.render.tasks.reconcile_render_jobs", "schedule": 30.0},
    "billing-minute": {"task": "billing.tasks.charge_accrued", "schedule": 60.0},
    "billing-fold-minutes": {"task": "billing.tasks.fold_minutes", "schedule": 3600.0},
    "billing-credit": {"task": "billing.tasks.check_credit", "schedule": 30.0},
    # Half an hour into the month, so the last minutes of the old one are charged first.
    "billing-invoices": {
        "task": "billing.tasks.issue_invoices",
        "schedule": crontab(minute=30, hour=0, day_of_month=1),
    },
    # After the members' own invoices, which each group invoice lists.
    "billing-group-invoices": {
        "task": "billing.tasks.issue_group_invoices",
        "schedule": crontab(minute=45, hour=0, day_of_month=1),
    },
}


@worker_ready.connect
def announce_worker(**kwargs: Any) -> None:
    """Report in at start, so staff need not wait for beat's first minute."""
    # Imported here: this module is loaded with the settings, before the models can be.
    from portal.tasks import record_heartbeat

    record_heartbeat.delay()


@worker_ready.connect
def recover_estimates(sender: Any = None, **kwargs: Any) -> None:
    """The estimate worker, at start: the probes it was running are started again. (The render worker takes
    its hosts' queues at start: ``sessions.render.queues``.)"""
    queues = {queue.name for queue in getattr(getattr(sender, "task_consumer", None), "queues", ())}
    if estimate_queue() in queues:
        app.send_task("sessions.render.tasks.recover_estimates")
