from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = "Billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Sessions never import billing: billing tells the launch path what offers cost and who may not launch.
        from billing.launch import BillingPricing
        from billing.metrics import BillingCollector
        from sessions.metrics import prometheus
        from sessions.notebooks import pricing

        pricing.register(BillingPricing())
        prometheus.add_collector(BillingCollector())
