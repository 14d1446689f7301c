from django.apps import AppConfig


class GpuSessionsConfig(AppConfig):
    name = "sessions"
    label = "gpu_sessions"
    verbose_name = "GPU sessions"
    default_auto_field = "django.db.models.BigAutoField"
