"""Billing's counters on /metrics: minutes billed and revenue, by GPU model, kind and market.

Registered with the /metrics view from ``BillingConfig.ready`` (sessions never import billing). Each
scrape is one grouped query over the usages, whose ``billed_minutes`` the meter advances in the same
transaction as the minute rows and ledger entries it writes, and which folding never changes: so the
counters only grow, and equal the ledger's revenue.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db.models import DecimalField, F, Sum
from prometheus_client.core import CounterMetricFamily, Metric

from billing.models import Usage

LABELS = ["model", "kind", "market"]


class BillingCollector:
    def collect(self) -> Iterable[Metric]:
        minutes = CounterMetricFamily("portal_billed_minutes", "Started minutes billed.", labels=LABELS)
        revenue = CounterMetricFamily(
            "portal_revenue", f"Money billed for minutes (in {settings.CURRENCY}).", labels=LABELS
        )
        amount = Sum(F("billed_minutes") * F("per_minute"), output_field=DecimalField(max_digits=20, decimal_places=6))
        rows = (
            Usage.objects.values_list("slice__gpu__model_name", "slice__kind", "market")
            .annotate(total_minutes=Sum("billed_minutes"), total_amount=amount)
            .order_by("slice__gpu__model_name", "slice__kind", "market")
        )
        for model, kind, market, count, total in rows:
            minutes.add_metric([model, kind, market], float(count or 0))
            revenue.add_metric([model, kind, market], float(total or 0))
        yield minutes
        yield revenue
