"""Celery tasks of the GPU fleet: thin, idempotent, calling sessions.gpus.fleet."""

from __future__ import annotations

from celery import shared_task

from sessions.gpus import hosts


@shared_task
def watch_hosts() -> dict[str, list[str]]:
    """Every few seconds: hosts whose agent went silent are lost; those silent too long are given up."""
    return hosts.watch()
