"""The notebook sessions' part of ``/metrics`` (``sessions.metrics.prometheus.add_collector``): sessions by state
and the spawn-time histogram, read from the database at each scrape."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from sessions.notebooks.models import NotebookSession

SPAWN_BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 180, 300)


class NotebookCollector:
    def collect(self) -> Iterable[Metric]:
        yield sessions_family()
        yield spawn_family()


def sessions_family() -> Metric:
    """Sessions by state, every state listed so a state emptying reads 0 rather than vanishing."""
    counts = dict(NotebookSession.objects.values("state").annotate(n=Count("pk")).values_list("state", "n"))
    family = GaugeMetricFamily("portal_sessions", "Notebook sessions by state.", labels=["state"])
    for state in NotebookSession.State.values:
        family.add_metric([state], counts.get(state, 0))
    return family


def spawn_family() -> Metric:
    """Requested-to-ready time of every session that became ready, counted in the database in one query."""
    took = ExpressionWrapper(F("ready_at") - F("requested_at"), output_field=DurationField())
    ready = NotebookSession.objects.filter(ready_at__isnull=False).annotate(took=took)
    sums = ready.aggregate(
        total=Count("pk"),
        seconds=Sum("took"),
        **{f"le{le}": Count("pk", filter=Q(took__lte=timedelta(seconds=le))) for le in SPAWN_BUCKETS_S},
    )
    buckets = [(str(float(le)), float(sums[f"le{le}"])) for le in SPAWN_BUCKETS_S]
    buckets.append(("+Inf", float(sums["total"])))
    seconds = sums["seconds"].total_seconds() if sums["seconds"] is not None else 0.0
    return HistogramMetricFamily(
        "portal_spawn_duration_seconds", "Time from a session's request to it being ready.", buckets, seconds
    )
