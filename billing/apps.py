from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = "Billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Sessions never import billing: billing tells the launch path what offers cost, and every allocation
        # (the workloads' gate) who may not start anything.
        from billing.launch import BillingPricing, CreditGate
        from billing.metrics import BillingCollector
        from sessions.gpus import pricing, workloads
        from sessions.metrics import prometheus

        pricing.register(BillingPricing())
        workloads.register_gate(CreditGate())
        prometheus.add_collector(BillingCollector())
