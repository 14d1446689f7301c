"""Handing out slices of GPUs and taking them back: ``allocate`` and ``release``.

Safe under concurrency: a request locks its owner's row (for the per-user
limit) and the GPU it places on, re-checks that GPU's layout under the lock,
and writes the slice, the instance and the GPU's bookkeeping in one
transaction. Partial unique constraints back this up in the database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Exists, F, Min, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from sessions.gpus import catalog, placement
from sessions.gpus.backends import BackendError, backend_for_host
from sessions.gpus.catalog import GpuModel, Profile
from sessions.gpus.models import Gpu, GpuInstance, Slice, SliceQuota
from sessions.gpus.placement import Layout

log = logging.getLogger(__name__)
Rule = Callable[[GpuModel, Sequence[tuple[Any, Layout]], Profile], tuple[Any, int] | None]


LAYOUT_FIELDS = ("memory_mask", "compute_used", "profile_counts", "layout_key")


@dataclass(frozen=True)
class SliceRequest:
    """What someone asks for: a MIG profile, a whole GPU or a time-sliced share, optionally on a model or host."""

    kind: str
    profile: str = ""
    model: str = ""
    host: str = ""


class AllocationRefused(Exception):
    """No slice was given; ``reason`` says why in words a user can act on."""

    def __init__(self, reason: str, code: str = "no_capacity", free: dict[str, int] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.code, self.free = reason, code, free or {}


class ReleaseRefused(Exception):
    pass


def allocate(owner: User, request: SliceRequest, holder: str = "", rule: Rule = placement.choose) -> Slice:
    with transaction.atomic():
        _check_limit(owner)
        if request.kind == Slice.Kind.MIG:
            return _allocate_mig(owner, request, holder, rule)
        if request.kind in (Slice.Kind.WHOLE, Slice.Kind.SHARED):
            return _allocate_gpu(owner, request, holder)
        raise AllocationRefused(f"Unknown kind of slice {request.kind!r}.", code="bad_request")


def _check_limit(owner: User) -> None:
    # Lock the owner's row first, so one person's parallel requests queue here; the count
    # must be a separate statement: a subquery would read the snapshot from before the wait.
    quota = SliceQuota.objects.filter(user=OuterRef("pk")).values("max_slices")[:1]
    row = User.objects.select_for_update().filter(pk=owner.pk).annotate(quota=Subquery(quota))
    found = row.values_list("quota").first()
    limit = int(settings.MAX_SLICES_PER_USER) if not found or found[0] is None else found[0]
    if Slice.objects.filter(owner=owner, released_at__isnull=True).count() >= limit:
        raise AllocationRefused(f"You already hold {limit} slice(s), your limit; stop one first.", code="quota")


def _gpus(request: SliceRequest, sharing: str) -> QuerySet[Gpu]:
    gpus = Gpu.objects.filter(sharing=sharing, state=Gpu.State.OK)
    if request.model:
        gpus = gpus.filter(model_name=request.model)
    if request.host:
        gpus = gpus.filter(host__name=request.host)
    return gpus


def _catalog_models_with(request: SliceRequest) -> list[GpuModel]:
    models = [request.model] if request.model else list(catalog.models())
    found = []
    for name in models:
        model = catalog.models().get(name)
        if model and any(profile.name == request.profile for profile in model.profiles):
            found.append(model)
    return found


def _allocate_mig(owner: User, request: SliceRequest, holder: str, rule: Rule) -> Slice:
    models = _catalog_models_with(request)
    for model in models:
        profile = model.profile(request.profile)
        taken = _place(owner, request, model, profile, holder, rule)
        if taken:
            return taken
    fleet_models = set(_gpus(request, Gpu.Sharing.MIG).values_list("model_name", flat=True).distinct())
    if not fleet_models & {model.name for model in models}:
        where = f" on {request.model}" if request.model else " in the fleet"
        raise AllocationRefused(f"No MIG GPU{where} has the profile {request.profile!r}.", code="unknown_profile")
    free = free_capacity(request.model or None)
    raise AllocationRefused(_no_capacity_message(request.profile, free), free=free)


def _take_layout_instance(owner: User, gpus: QuerySet[Gpu], profile: Profile, holder: str) -> Slice | None:
    static = gpus.filter(mig_policy=Gpu.Policy.STATIC)
    in_use = Slice.objects.filter(instance=OuterRef("pk"), released_at__isnull=True)
    candidates = GpuInstance.objects.filter(origin=GpuInstance.Origin.LAYOUT, profile=profile.name, gpu__in=static)
    free = candidates.filter(~Exists(in_use)).select_for_update(skip_locked=True)
    instance = free.order_by("gpu_id", "start").first()
    if instance is None:
        return None
    gpu = Gpu.objects.select_for_update().get(pk=instance.gpu_id)
    gpu.active_slices += 1
    gpu.save(update_fields=["active_slices"])
    return _record(owner, gpu, instance, profile, holder)


def _place(
    owner: User, request: SliceRequest, model: GpuModel, profile: Profile, holder: str, rule: Rule
) -> Slice | None:
    """A free instance of a static layout if there is one, else a new instance where the rule says.

    Dynamic GPUs are grouped by layout: a fleet of a thousand GPUs has far fewer
    distinct layouts, and any GPU of the chosen layout is as good as another.
    """
    room = model.compute_slices - profile.compute_slices
    gpus = _gpus(request, Gpu.Sharing.MIG).filter(model_name=model.name)
    fitting = gpus.filter(Q(mig_policy=Gpu.Policy.STATIC) | Q(compute_used__lte=room))
    groups = fitting.values("mig_policy", "layout_key").annotate(first_id=Min("id")).order_by("first_id")
    for _attempt in range(20):
        found = list(groups)
        if any(group["mig_policy"] == Gpu.Policy.STATIC for group in found):
            taken = _take_layout_instance(owner, gpus, profile, holder)
            if taken:
                return taken
        candidates = [
            (group, Layout.from_key(group["layout_key"]))
            for group in found
            if group["mig_policy"] == Gpu.Policy.DYNAMIC
        ]
        choice = rule(model, candidates, profile)
        if choice is None:
            return None
        group, start = choice
        same = gpus.filter(mig_policy=Gpu.Policy.DYNAMIC, layout_key=group["layout_key"])
        same = same.select_for_update(skip_locked=True).select_related("host")
        # Try the group's first GPU by key; only if a parallel request holds it, look for its twins.
        locked = same.filter(pk=group["first_id"]).first() or same.order_by("id").first()
        if locked is not None:
            return _place_on(owner, locked, model, profile, start, holder)
    return None  # every GPU we chose was taken by parallel requests; the caller reports no capacity


def _place_on(owner: User, gpu: Gpu, model: GpuModel, profile: Profile, start: int, holder: str) -> Slice:
    layout = gpu.layout()
    try:
        made = backend_for_host(gpu.host.backend).create_instance(gpu.uuid, profile, start)
    except BackendError as error:
        raise AllocationRefused(f"The GPU host refused the slice: {error}", code="backend") from None
    instance = GpuInstance.record(gpu, made, GpuInstance.Origin.DYNAMIC)
    gpu.set_layout(layout.with_instance(profile, start))
    gpu.active_slices += 1
    gpu.save(update_fields=[*LAYOUT_FIELDS, "active_slices"])
    return _record(owner, gpu, instance, profile, holder)


def _record(owner: User, gpu: Gpu, instance: GpuInstance, profile: Profile, holder: str) -> Slice:
    return Slice.objects.create(
        gpu=gpu,
        instance=instance,
        kind=Slice.Kind.MIG,
        profile=profile.name,
        placement_start=instance.start,
        placement_size=instance.size,
        compute_slices=profile.compute_slices,
        memory_gib=profile.memory_gib,
        device_uuid=instance.device_uuid,
        owner=owner,
        holder=holder,
        allocated_at=timezone.now(),
    )


def _allocate_gpu(owner: User, request: SliceRequest, holder: str) -> Slice:
    gpus = _gpus(request, request.kind).select_for_update(skip_locked=True, of=("self",))
    if request.kind == Slice.Kind.WHOLE:
        gpu = gpus.filter(active_slices=0).order_by("index", "id").first()
    else:
        gpu = gpus.filter(active_slices__lt=F("share_limit")).order_by("active_slices", "id").first()
    if gpu is None:
        label = "whole GPU" if request.kind == Slice.Kind.WHOLE else "time-sliced share"
        where = f" of {request.model}" if request.model else ""
        raise AllocationRefused(f"No {label}{where} is free now; try again later or pick a MIG slice.")
    gpu.active_slices += 1
    gpu.save(update_fields=["active_slices"])
    return Slice.objects.create(
        gpu=gpu,
        kind=request.kind,
        compute_slices=gpu.catalog_model.compute_slices or 1,
        memory_gib=gpu.memory_gib,
        device_uuid=gpu.uuid,
        owner=owner,
        holder=holder,
        allocated_at=timezone.now(),
    )


def release(slice_id: int, by: User | None = None, reason: str = "released") -> Slice:
    """Give a slice back. ``by`` is checked: only the owner or staff may release it."""
    with transaction.atomic():
        taken = Slice.objects.select_for_update(of=("self",)).select_related("instance").filter(pk=slice_id).first()
        if taken is None or (by is not None and taken.owner_id != by.pk and not by.is_staff):
            raise ReleaseRefused("No such slice among yours.")
        if taken.released_at is not None:
            raise ReleaseRefused("This slice was already released.")
        gpu = Gpu.objects.select_for_update().select_related("host").get(pk=taken.gpu_id)
        instance = taken.instance
        taken.released_at, taken.release_reason = timezone.now(), reason[:100]
        taken.save(update_fields=["released_at", "release_reason"])
        if instance is not None and instance.origin == GpuInstance.Origin.DYNAMIC:
            backend_for_host(gpu.host.backend).destroy_instance(gpu.uuid, instance.gi_id)
            gpu.set_layout(gpu.layout().without_instance(gpu.catalog_model.profile(instance.profile), instance.start))
            instance.delete()
        gpu.active_slices -= 1
        gpu.save(update_fields=[*LAYOUT_FIELDS, "active_slices"])
        return taken


def free_capacity(model_name: str | None = None) -> dict[str, int]:
    """How many more of each 'model profile' fit right now, summed over GPUs (each counted alone)."""
    free: dict[str, int] = {}
    gpus = Gpu.objects.filter(sharing=Gpu.Sharing.MIG, state=Gpu.State.OK)
    if model_name:
        gpus = gpus.filter(model_name=model_name)
    for gpu in gpus:
        for profile, count in gpu_capacity(gpu).items():
            key = f"{gpu.model_name} {profile}"
            free[key] = free.get(key, 0) + count
    return free


def gpu_capacity(gpu: Gpu) -> dict[str, int]:
    model = gpu.catalog_model
    if gpu.mig_policy == Gpu.Policy.DYNAMIC:
        return placement.capacity(model, gpu.layout())
    # Whole-GPU and shared slices have no instance; a NULL in NOT IN would hide every instance.
    busy = Slice.objects.filter(released_at__isnull=True, instance__isnull=False).values("instance_id")
    counts = {profile.name: 0 for profile in model.profiles}
    for name in gpu.instances.exclude(pk__in=busy).values_list("profile", flat=True):
        counts[name] += 1
    return counts


def _no_capacity_message(profile: str, free: dict[str, int]) -> str:
    available = [f"{name} ×{count}" for name, count in sorted(free.items()) if count]
    tail = "Free right now: " + ", ".join(available) + "." if available else "Nothing is free right now."
    return f"No {profile} slice is free now. {tail}"
