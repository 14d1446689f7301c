"""The GPU portal's Django project: settings, URLs, ASGI app, Celery app, login and dashboard."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
