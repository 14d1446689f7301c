"""Celery tasks of the GPU fleet: thin, idempotent, calling sessions.gpus.fleet."""

from __future__ import annotations

from celery import shared_task

from sessions.gpus import hosts
from sessions.gpus.fleet import sync_fleet


@shared_task
def sync_gpus() -> int:
    """Every 5 minutes: re-discover GPUs, so a GPU that vanished or came back shows on the fleet page."""
    return sum(host.gpus.count() for host in sync_fleet())


@shared_task
def watch_hosts() -> dict[str, list[str]]:
    """Every few seconds: hosts whose agent went silent are lost; those silent too long are given up."""
    return hosts.watch()
