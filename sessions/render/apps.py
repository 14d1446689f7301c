from django.apps import AppConfig


class RenderConfig(AppConfig):
    """The render jobs app: render jobs, their chunks and frames."""

    name = "sessions.render"
    label = "render"
    verbose_name = "Render jobs"
    default_auto_field = "django.db.models.BigAutoField"
