from django.apps import AppConfig


class MetricsConfig(AppConfig):
    """The live gpu metrics app: per-minute GPU history."""

    name = "sessions.metrics"
    label = "metrics"
    verbose_name = "Live GPU metrics"
    default_auto_field = "django.db.models.BigAutoField"
