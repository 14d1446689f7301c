"""Websocket routes of every app, in one list."""

from django.urls import path

from portal.consumers import NotificationConsumer

websocket_urlpatterns = [
    path("ws/notifications/", NotificationConsumer.as_asgi()),
]
