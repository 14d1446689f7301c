from django.apps import AppConfig


class NotebooksConfig(AppConfig):
    """The notebook sessions app: notebook images and sessions."""

    name = "sessions.notebooks"
    label = "notebooks"
    verbose_name = "Notebook sessions"
    default_auto_field = "django.db.models.BigAutoField"
