from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    """The container runtime: Docker engines per host, container specs, the firewall, the render sandbox. It owns
    no table."""

    name = "sessions.runtime"
    label = "runtime"
    verbose_name = "Container runtime"
