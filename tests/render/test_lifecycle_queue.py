"""Render work goes to a queue of its own, so a slow render never waits in front of the billing tick or a
session start; the estimate's probe to another, so an upload is estimated whatever renders; everything else
stays on the default queue."""

from __future__ import annotations

from portal.celery import ESTIMATE_TASKS, RENDER_TASKS, app, estimate_queue, render_queue


def queue_of(task: str) -> str:
    return str(app.amqp.router.route({}, task)["queue"].name)


def test_the_slices_workers_go_to_the_render_queue(settings) -> None:  # type: ignore[no-untyped-def]
    assert render_queue() == f"{settings.CELERY_TASK_DEFAULT_QUEUE}-render"
    for task in ("sessions.render.tasks.work_on_slice", "sessions.render.tasks.recover_render_work"):
        assert task in RENDER_TASKS and queue_of(task) == render_queue()


def test_the_probe_goes_to_a_lane_of_its_own_never_behind_a_render(settings) -> None:  # type: ignore[no-untyped-def]
    assert estimate_queue() == f"{settings.CELERY_TASK_DEFAULT_QUEUE}-estimate" != render_queue()
    for task in ("sessions.render.tasks.estimate_job", "sessions.render.tasks.recover_estimates"):
        assert task in ESTIMATE_TASKS and queue_of(task) == estimate_queue()
    settings.ESTIMATE_QUEUE = "estimates-elsewhere"
    assert queue_of("sessions.render.tasks.estimate_job") == "estimates-elsewhere"


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
