"""Billing's counters on /metrics: minutes billed and revenue, by GPU model, kind and market.

Registered with the /metrics view from ``BillingConfig.ready`` (sessions never import billing). Each
scrape reads the ``BilledTotal`` rows, one per GPU model, kind and market whatever the history: the meter
adds to them in the statement that advances the usages' ``billed_minutes`` (and folding never changes
those), so the counters only grow, equal the sum over every usage, and equal the ledger's revenue.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from prometheus_client.core import CounterMetricFamily, Metric

from billing.models import BilledTotal

LABELS = ["model", "kind", "market"]


class BillingCollector:
    def collect(self) -> Iterable[Metric]:
        minutes = CounterMetricFamily("portal_billed_minutes", "Started minutes billed.", labels=LABELS)
        revenue = CounterMetricFamily(
            "portal_revenue", f"Money billed for minutes (in {settings.CURRENCY}).", labels=LABELS
        )
        rows = BilledTotal.objects.order_by("model_name", "kind", "market")
        for model, kind, market, count, total in rows.values_list("model_name", "kind", "market", "minutes", "amount"):
            minutes.add_metric([model, kind, market], float(count))
            revenue.add_metric([model, kind, market], float(total))
        yield minutes
        yield revenue
