"""Websocket routes of every app, in one list."""

from django.urls import path

from portal.consumers import NotificationConsumer
from sessions.metrics.consumers import MetricsConsumer
from sessions.render.consumers import RenderProgressConsumer

websocket_urlpatterns = [
    path("ws/notifications/", NotificationConsumer.as_asgi()),
    path("ws/metrics/sessions/<int:session_id>/", MetricsConsumer.as_asgi()),
    path("ws/metrics/<str:stream>/", MetricsConsumer.as_asgi()),
    path("ws/render/", RenderProgressConsumer.as_asgi()),
    path("ws/render/<int:job_id>/", RenderProgressConsumer.as_asgi()),
]
