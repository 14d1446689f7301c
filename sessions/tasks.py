"""Celery tasks of the sessions app: thin, id-taking, idempotent."""

from __future__ import annotations

from celery import Task, shared_task

from sessions.gpus.fleet import sync_fleet


@shared_task
def sync_gpus() -> int:
    """Re-discover GPUs, so a GPU that vanished or came back shows on the fleet page."""
    return sum(host.gpus.count() for host in sync_fleet())


@shared_task(bind=True, max_retries=None)
def start_notebook(self: Task, session_id: int) -> None:
    """Ask JupyterHub to start a session's server (enqueued when the session is committed).

    While the hub does not answer, the service says how long to wait and the task is retried
    (Celery's own retry); the service alone decides when to give up.
    """
    from sessions.notebooks.services import ask_hub_to_start

    pause = ask_hub_to_start(session_id, attempt=self.request.retries)
    if pause is not None:
        raise self.retry(countdown=pause)


@shared_task
def reconcile_sessions() -> dict[str, int]:
    """Every 20 s: end sessions whose containers are gone, remove strays, free orphan slices."""
    from sessions.notebooks.reconcile import reconcile

    return reconcile()


@shared_task
def cull_idle_sessions() -> dict[str, int]:
    """Every minute: warn, then stop, sessions idle too long or past the maximum age."""
    from sessions.notebooks.culling import cull, hub_activity
    from sessions.notebooks.models import NotebookSession

    running = list(NotebookSession.objects.filter(state=NotebookSession.State.RUNNING).select_related("owner"))
    return cull(hub_activity(running))


@shared_task
def prune_gpu_history() -> int:
    """Hourly: delete per-minute GPU history older than PORTAL_METRICS_RETENTION_DAYS."""
    from django.conf import settings

    from sessions.metrics.history import delete_older_than

    return delete_older_than(settings.METRICS_RETENTION_DAYS)
