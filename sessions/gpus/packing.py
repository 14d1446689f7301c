"""Which host a slice goes to when GPUs of several hosts would serve it equally (issue 32, item 4).

PORTAL_PLACEMENT says: ``pack`` (the default) puts it on the host that holds the most slices already, so whole
hosts stay free, for whole-GPU requests and for draining; ``spread`` on the host that holds the fewest, so one
host's loss ends as little as possible. A host's load is the slices its GPUs hold (every kind). Ties go to the
lowest GPU id. The choice among a host's GPUs is the allocator's own (the MIG layout's value, a whole GPU's
index, a shared GPU's fewest sessions); this only orders the hosts. A fleet of one host pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db.models import OuterRef, QuerySet, Subquery, Sum

from sessions.gpus.models import Gpu, GpuHost

PACK, SPREAD = "pack", "spread"


def by_host(gpus: QuerySet[Gpu]) -> tuple[QuerySet[Gpu], tuple[str, ...]]:
    """The GPUs with their hosts' load and the ordering that fills the right host first; on a fleet of one host,
    as they are (the load would be a sum per candidate GPU, for nothing)."""
    if GpuHost.objects.count() <= 1:
        return gpus, ()
    return with_host_load(gpus), (host_order(),)


def host_order() -> str:
    """The ordering of a queryset annotated by ``with_host_load``: the host to fill first."""
    return "host_load" if settings.PLACEMENT == SPREAD else "-host_load"


def with_host_load(gpus: QuerySet[Gpu]) -> QuerySet[Gpu]:
    load = Gpu.objects.filter(host=OuterRef("host")).values("host").annotate(held=Sum("active_slices")).values("held")
    return gpus.annotate(host_load=Subquery(load))


def loads(hosts: Iterable[int]) -> dict[int, int]:
    """Each host's load: the slices its GPUs hold."""
    rows = Gpu.objects.filter(host_id__in=list(hosts)).values("host_id").annotate(held=Sum("active_slices"))
    return {row["host_id"]: int(row["held"] or 0) for row in rows}


def first_by_host(candidates: list[tuple[int, int]], load: dict[int, int]) -> int:
    """Of (GPU id, host id) pairs equally good to the allocator, the GPU on the host to fill first."""
    sign = 1 if settings.PLACEMENT == SPREAD else -1
    return min(candidates, key=lambda pair: (sign * load.get(pair[1], 0), pair[0]))[0]
