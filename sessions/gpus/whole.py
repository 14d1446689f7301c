"""Whole GPUs and time-sliced shares: no placement, a row lock and a count (the MIG placement is the
allocator's own)."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import F, OuterRef, QuerySet, Subquery, Sum

from sessions.gpus import packing
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, GpuHost, Slice
from sessions.gpus.requests import AllocationRefused, SliceRequest, gpus_for, new_slice, refuse_if_hosts_away


def allocate_gpu(owner: User, request: SliceRequest, holder: Holder | None) -> Slice:
    """A whole GPU, or a share of a time-sliced one: the row lock waits, and the check runs again after it."""
    label = "whole GPU" if request.kind == Slice.Kind.WHOLE else "time-sliced share"
    where = f" of {request.model}" if request.model else ""
    pool = gpus_for(request, request.kind)
    if not pool.exists():
        anywhere = gpus_for(request, request.kind, any_host=True)
        if not anywhere.exists():
            raise AllocationRefused(f"No GPU{where} in the fleet is offered as a {label}.", code="unavailable")
        refuse_if_hosts_away(anywhere, f"a {label}{where}")
    gpus, hosts_first = _by_host(pool.select_for_update(of=("self",), no_key=True))
    if request.kind == Slice.Kind.WHOLE:  # on the host PORTAL_PLACEMENT fills first
        gpu = gpus.filter(active_slices=0).order_by(*hosts_first, "index", "id").first()
    else:  # on that host, the GPU with the fewest sessions
        free = gpus.filter(active_slices__lt=F("share_limit"))
        gpu = free.order_by(*hosts_first, "active_slices", "id").first()
    if gpu is None:
        raise AllocationRefused(f"No {label}{where} is free now; try again later or pick a MIG slice.")
    gpu.active_slices += 1
    gpu.save(update_fields=["active_slices"])
    taken = new_slice(owner, request, gpu.pk, holder, gpu.uuid, gpu.catalog_model.compute_slices or 1, gpu.memory_gib)
    if request.kind == Slice.Kind.SHARED:
        taken.shares = max(gpu.share_limit, 1)  # frozen: the rate a share pays does not move with the setting
    taken.save(force_insert=True)
    return taken


def _by_host(gpus: QuerySet[Gpu]) -> tuple[QuerySet[Gpu], tuple[str, ...]]:
    """The GPUs with their host's load (``sessions.gpus.packing``) and the ordering that fills the right host
    first; on a fleet of one host, as they are.

    The host count stays a query of its own. Folded into this one (a CASE around the sum), it made a one-host
    fleet's choice slower, not faster: Django compiles the larger statement again on every call (about 1 ms
    more) and it checks for another host per candidate GPU (measured on 192 GPUs of one host: p50 2.9 ms with
    the count, 4.7 ms folded).
    """
    if GpuHost.objects.count() <= 1:
        return gpus, ()
    held = Gpu.objects.filter(host=OuterRef("host")).values("host").annotate(held=Sum("active_slices")).values("held")
    return gpus.annotate(host_load=Subquery(held)), ("-host_load" if packing.busiest_first() else "host_load",)
