from django.urls import path

from sessions.notebooks import api

urlpatterns = [
    path("launch-spec", api.launch_spec, name="notebook-launch-spec"),
    path("events", api.event, name="notebook-events"),
]
