from django.apps import AppConfig, apps
from django.db.models.signals import post_migrate


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Portal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from portal.roles import ensure_roles

        # Billing's permissions exist only once billing's own post_migrate ran.
        post_migrate.connect(ensure_roles, sender=apps.get_app_config("billing"))
