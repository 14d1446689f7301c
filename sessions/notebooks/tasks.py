"""Celery tasks of notebook sessions: thin, id-taking, idempotent; each calls one service.

The services enqueue ``start_notebook`` by its name (``services.START_NOTEBOOK``), after commit,
so they need not import this module: it imports them.
"""

from __future__ import annotations

from celery import Task, shared_task

from sessions.notebooks import culling, reconcile, services, spot


@shared_task(bind=True, max_retries=None, name=services.START_NOTEBOOK)
def start_notebook(self: Task, session_id: int) -> None:
    """Ask JupyterHub to start a session's server (enqueued when the session is committed).

    While the hub does not answer, the service says how long to wait and the task is retried
    (Celery's own retry); the service alone decides when to give up.
    """
    pause = services.ask_hub_to_start(session_id, attempt=self.request.retries)
    if pause is not None:
        raise self.retry(countdown=pause)


@shared_task
def reconcile_sessions() -> dict[str, int]:
    """Every 20 s: end sessions whose containers are gone, remove strays, free orphan slices."""
    return reconcile.reconcile()


@shared_task
def cull_idle_sessions() -> dict[str, int]:
    """Every minute: warn, then stop, sessions idle too long or past the maximum age."""
    return culling.cull_running()


@shared_task(name=spot.PREEMPT_SPOT)
def preempt_spot(reclaim_id: int) -> None:
    """A reclaim's grace time is up (enqueued with that countdown): stop its spot session."""
    services.preempt_spot(reclaim_id)


@shared_task
def preempt_due_spot() -> int:
    """Every 15 s: stop the spot sessions whose grace time is up, should a reclaim's own task be lost."""
    return services.preempt_due_spot()
