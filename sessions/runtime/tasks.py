"""Celery tasks of the container runtime: thin and idempotent."""

from __future__ import annotations

from celery import shared_task

from sessions.runtime import swarm


@shared_task
def watch_swarm() -> int:
    """Every few seconds, with a Swarm manager configured: each GPU host's node as the Swarm sees it."""
    return swarm.watch()
