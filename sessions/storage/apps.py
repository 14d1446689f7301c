from django.apps import AppConfig


class StorageConfig(AppConfig):
    """The storage quotas app: storage quotas and what each person uses."""

    name = "sessions.storage"
    label = "storage"
    verbose_name = "Storage quotas"
    default_auto_field = "django.db.models.BigAutoField"
