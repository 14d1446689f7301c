"""Render work goes to a queue of its own, so a slow render never waits in front of the billing tick or a
session start; everything else stays on the default queue."""

from __future__ import annotations

from portal.celery import RENDER_TASKS, app, render_queue


def queue_of(task: str) -> str:
    return str(app.amqp.router.route({}, task)["queue"].name)


def test_the_probe_and_the_slices_workers_go_to_the_render_queue(settings) -> None:  # type: ignore[no-untyped-def]
    assert render_queue() == f"{settings.CELERY_TASK_DEFAULT_QUEUE}-render"
    for task in ("sessions.render.tasks.estimate_job", "sessions.render.tasks.work_on_slice"):
        assert task in RENDER_TASKS and queue_of(task) == render_queue()


def test_the_billing_tick_a_session_start_and_dispatch_stay_on_the_default_queue(settings) -> None:  # type: ignore[no-untyped-def]
    for task in (
        "billing.tasks.charge_accrued",
        "sessions.notebooks.tasks.start_notebook",
        "sessions.render.tasks.dispatch_job",
        "sessions.render.tasks.reconcile_render_jobs",
    ):
        assert queue_of(task) == settings.CELERY_TASK_DEFAULT_QUEUE


def test_a_queue_named_in_the_settings_wins(settings) -> None:  # type: ignore[no-untyped-def]
    settings.RENDER_QUEUE = "renders-elsewhere"
    assert queue_of("sessions.render.tasks.work_on_slice") == "renders-elsewhere"
