from django.apps import AppConfig


class GpusConfig(AppConfig):
    """The GPUs and slices app: the hosts, GPUs, MIG instances and slices; the allocator and the orders each
    host's agent carries out."""

    name = "sessions.gpus"
    label = "gpus"
    verbose_name = "GPUs and slices"
    default_auto_field = "django.db.models.BigAutoField"
