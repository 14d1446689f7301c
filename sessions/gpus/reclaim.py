"""Which spot slice to reclaim for an on-demand request the fleet had no room for (read-only: the caller
records the promise)."""

from __future__ import annotations

from django.db.models import Exists, OuterRef

from sessions.gpus import placement
from sessions.gpus.models import Gpu, Reclaim, Slice
from sessions.gpus.requests import SliceRequest, checked, gpus_for


def reclaimable(request: SliceRequest) -> Slice | None:
    """The spot slice whose end would make room for ``request`` (one refused for capacity), or None.

    Only an active spot slice a workload holds (a notebook session, a render job) and that nobody is waiting
    for already; never an on-demand one. The youngest first: it has the least work to lose. The room it leaves
    must fit the request: the MIG layout without its instance admits the profile (dynamic), or its instance is of
    the profile (static); a whole GPU it alone holds; a share of a full time-sliced GPU.
    Read-only: the caller records the promise (``Reclaim``) in the turn its refused ``allocate`` took.
    """
    request = checked(request)
    promised = Reclaim.objects.filter(slice=OuterRef("pk"), state=Reclaim.State.PENDING)
    spot = Slice.objects.filter(
        released_at__isnull=True,
        market=Slice.Market.SPOT,
        holder_id__isnull=False,
        kind=request.kind,
        gpu__in=gpus_for(request, request.kind),
    )
    spot = spot.exclude(Exists(promised)).select_related("gpu").order_by("-allocated_at", "-id")
    return next((taken for taken in spot if room_after(taken, request)), None)


def room_after(taken: Slice, request: SliceRequest) -> bool:
    """Whether ``request`` fits on ``taken``'s GPU once ``taken`` is gone."""
    gpu = taken.gpu
    if request.kind == Slice.Kind.WHOLE:
        return gpu.active_slices == 1
    if request.kind == Slice.Kind.SHARED:
        return gpu.active_slices >= gpu.share_limit
    model = gpu.catalog_model
    if not any(profile.name == request.profile for profile in model.profiles):
        return False
    if gpu.mig_policy == Gpu.Policy.STATIC:
        return taken.profile == request.profile
    if taken.placement_start is None:
        return False
    without = gpu.layout().without_instance(model.profile(taken.profile), taken.placement_start)
    return bool(placement.free_starts(model, without, model.profile(request.profile)))
