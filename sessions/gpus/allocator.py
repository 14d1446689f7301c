"""Handing out slices of GPUs and taking them back: ``allocate`` and ``release``.

Safe under concurrency: a request locks its owner's row (for the per-user
limit) and the GPU it places on, re-checks that GPU's layout under the lock,
and writes the slice, the instance and the GPU's bookkeeping in one
transaction. Partial unique constraints back this up in the database.

Fast: on PostgreSQL each call is its own transaction (``sql.transaction``)
whose BEGIN and COMMIT travel with its first and last statements, statements
that do not depend on each other share a round trip, and the layouts to
choose from come from an in-memory view that re-reads only the GPU rows
changed since it last looked (``fleetview``). The view also proposes where a
request goes before it looks, so the claim travels with the limit check.
An allocate+release pair costs six round trips: allocate = limit check, look
and claim; the driver's create; the rows and COMMIT. Release = mark released
and lock the GPU; the driver's destroy; the GPU's layout and COMMIT.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Exists, F, OuterRef, QuerySet
from django.utils import timezone

from sessions.gpus import catalog, fleetview, placement, sql
from sessions.gpus.backends import BackendError, backend_for_host
from sessions.gpus.catalog import GpuModel, Profile
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, Slice, SliceQuota
from sessions.gpus.placement import Layout
from sessions.gpus.sql import Rows, Statement, batch, for_update, one

log = logging.getLogger(__name__)
Rule = Callable[[GpuModel, Sequence[tuple[Any, Layout]], Profile], tuple[Any, int] | None]


GPU, HOST, INSTANCE = Gpu._meta.db_table, GpuHost._meta.db_table, GpuInstance._meta.db_table
SLICE, QUOTA, USER = Slice._meta.db_table, SliceQuota._meta.db_table, User._meta.db_table


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
    with sql.transaction():
        if request.kind == Slice.Kind.MIG:
            models = _catalog_models_with(request)
            # The first look at the fleet rides along with the limit check, and so does the claim
            # for where the view, as it stands, would place the request: two round trips fewer.
            if sql.manual() and not request.host:
                view = fleetview.current()
                guess = _guess(view, models, request.profile, rule)
                claim = [_claim_statement(request, *guess)] if guess else []
                rows = _check_limit(owner, view.statement(), *claim)
                view.apply(rows[0])
                if guess and rows[1]:
                    return _made(owner, *guess, rows[1][0], holder)
                return _allocate_mig(owner, request, holder, rule, models, view)
            first = [_groups(request, models[0], models[0].profile(request.profile))] if models else []
            rows = _check_limit(owner, *first)
            return _allocate_mig(owner, request, holder, rule, models, None, rows[0] if rows else None)
        _check_limit(owner)
        if request.kind in (Slice.Kind.WHOLE, Slice.Kind.SHARED):
            return _allocate_gpu(owner, request, holder)
        raise AllocationRefused(f"Unknown kind of slice {request.kind!r}.", code="bad_request")


def _check_limit(owner: User, *also: Statement) -> list[Rows]:
    """Refuse if the owner holds their limit of slices; else return the rows of the ``also`` statements."""
    # Lock the owner's row first, so one person's parallel requests queue here; the count is
    # its own statement (same round trip), so it reads a snapshot taken after the lock was won.
    quota, held, *rest = batch(
        (
            f"SELECT q.max_slices FROM {USER} u LEFT JOIN {QUOTA} q ON q.user_id = u.id WHERE u.id = %s"
            + for_update(of="u"),
            [owner.pk],
        ),
        (f"SELECT count(*) FROM {SLICE} WHERE owner_id = %s AND released_at IS NULL", [owner.pk]),
        *also,
    )
    found = quota[0][0] if quota else None
    limit = int(settings.MAX_SLICES_PER_USER) if found is None else int(found)
    if held[0][0] >= limit:
        raise AllocationRefused(f"You already hold {limit} slice(s), your limit; stop one first.", code="quota")
    return rest


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


def _allocate_mig(
    owner: User,
    request: SliceRequest,
    holder: str,
    rule: Rule,
    models: list[GpuModel],
    view: fleetview.FleetView | None,
    looked: Rows | None = None,
) -> Slice:
    for number, model in enumerate(models):
        profile = model.profile(request.profile)
        found = view.layouts(model, profile) if view else looked if number == 0 else None
        taken = _place(owner, request, model, profile, holder, rule, found, view)
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
    owner: User,
    request: SliceRequest,
    model: GpuModel,
    profile: Profile,
    holder: str,
    rule: Rule,
    found: Rows | None = None,
    view: fleetview.FleetView | None = None,
) -> Slice | None:
    """A free instance of a static layout if there is one, else a new instance where the rule says.

    Dynamic GPUs are grouped by layout: a fleet of a thousand GPUs has far fewer
    distinct layouts, and any GPU of the chosen layout is as good as another.
    """
    for _attempt in range(20):
        from_view = view is not None and found is not None
        found = found if found is not None else one(*_groups(request, model, profile))
        if any(policy == Gpu.Policy.STATIC for policy, _, _ in found):
            taken = _take_layout_instance(owner, _gpus(request, Gpu.Sharing.MIG), profile, holder)
            if taken:
                return taken
        choice = _choose(rule, model, profile, found, view if from_view else None)
        if choice is None and from_view:
            found = None  # a refusal is confirmed by the database itself, never by the view alone
            continue
        if choice is None:
            return None
        key, start = choice
        taken = _claim(owner, request, model, profile, Layout.from_key(key), start, holder)
        if taken:
            return taken
        found = None  # parallel requests took every GPU with that layout, or the view was out of date
        if view:
            view.forget()
    return None  # every GPU we chose was taken by parallel requests; the caller reports no capacity


def _guess(
    view: fleetview.FleetView, models: list[GpuModel], profile_name: str, rule: Rule
) -> tuple[GpuModel, Profile, Layout, int] | None:
    """Where the request would go by the view as it stands, before this request's look.

    The claim for it then rides along with the request's first round trip. The
    view holds every change this process committed; what others committed
    since the last look it may lack, so a guess can find its layout gone (the
    claim takes nothing, and the request goes the long way) or, rarely, be a
    little less good than a fresh look would give. It is never wrong: the
    claim re-checks the layout under the row lock. Static layouts are left to
    the long way.
    """
    if view.since is None:
        return None

    def guess() -> tuple[GpuModel, Profile, Layout, int] | None:
        for model in models:
            profile = model.profile(profile_name)
            found = view.layouts(model, profile)
            if any(policy == Gpu.Policy.STATIC for policy, _, _ in found):
                return None
            choice = _choose(rule, model, profile, found, view)
            if choice is not None:
                return model, profile, Layout.from_key(choice[0]), choice[1]
        return None

    return view.memo(("guess", rule, *(model.name for model in models), profile_name), guess)


def _choose(
    rule: Rule, model: GpuModel, profile: Profile, found: Rows, view: fleetview.FleetView | None
) -> tuple[Any, int] | None:
    """Where the rule places ``profile`` among the dynamic layouts found; the view keeps the answer."""

    def decide() -> tuple[Any, int] | None:
        candidates = [(key, Layout.from_key(key)) for policy, key, _ in found if policy == Gpu.Policy.DYNAMIC]
        return rule(model, candidates, profile)

    return view.memo(("choice", rule, model.name, profile.name), decide) if view else decide()


def _groups(request: SliceRequest, model: GpuModel, profile: Profile) -> Statement:
    """The distinct layouts among GPUs where ``profile`` may fit, each with its first GPU's id."""
    where, params = _placeable(request, model)
    return (
        f"SELECT mig_policy, layout_key, min(id) FROM {GPU} WHERE {where}"
        " AND (mig_policy = 'static' OR compute_used <= %s) GROUP BY mig_policy, layout_key ORDER BY 3",
        [*params, model.compute_slices - profile.compute_slices],
    )


def _placeable(request: SliceRequest, model: GpuModel) -> tuple[str, list[Any]]:
    """The WHERE clause (and its parameters) for working MIG GPUs of ``model`` the request may use."""
    where, params = "sharing = 'mig' AND state = 'ok' AND model_name = %s", [model.name]
    if request.host:
        where += f" AND host_id IN (SELECT id FROM {HOST} WHERE name = %s)"
        params.append(request.host)
    return where, params


def _claim(
    owner: User, request: SliceRequest, model: GpuModel, profile: Profile, layout: Layout, start: int, holder: str
) -> Slice | None:
    """Claim a GPU with this layout (None when parallel requests took them all) and make the slice on it."""
    claimed = one(*_claim_statement(request, model, profile, layout, start))
    return _made(owner, model, profile, layout, start, claimed[0], holder) if claimed else None


def _claim_statement(request: SliceRequest, model: GpuModel, profile: Profile, layout: Layout, start: int) -> Statement:
    """Lock the first free GPU with this layout and write its new layout, in one statement.

    The lock skips GPUs that parallel requests hold and re-checks the layout of the
    row it takes, so two requests never place on the same old picture of a GPU.
    Returns no row when every GPU with that layout was taken meanwhile.
    """
    where, params = _placeable(request, model)
    after = layout.with_instance(profile, start)
    return (
        f"UPDATE {GPU} SET memory_mask = %s, compute_used = %s, profile_counts = %s, layout_key = %s,"
        f" active_slices = active_slices + 1 WHERE id = (SELECT id FROM {GPU} WHERE {where}"
        " AND mig_policy = 'dynamic' AND compute_used = %s AND layout_key = %s ORDER BY id LIMIT 1"
        f"{for_update(skip_locked=True)}) RETURNING id, uuid, (SELECT backend FROM {HOST} WHERE id = host_id)",
        [*_layout_values(after), *params, layout.compute_used, layout.key],
    )


def _made(
    owner: User,
    model: GpuModel,
    profile: Profile,
    layout: Layout,
    start: int,
    claimed: tuple[Any, ...],
    holder: str,
) -> Slice:
    """Have the driver make the instance on the claimed GPU, then record it and the slice (and commit)."""
    gpu_id, gpu_uuid, backend = claimed
    try:
        made = backend_for_host(backend).create_instance(gpu_uuid, profile, start)
    except BackendError as error:
        raise AllocationRefused(f"The GPU host refused the slice: {error}", code="backend") from None
    values = {
        "gpu_id": gpu_id,
        "kind": Slice.Kind.MIG,
        "profile": profile.name,
        "placement_start": made.start,
        "placement_size": made.size,
        "compute_slices": profile.compute_slices,
        "memory_gib": profile.memory_gib,
        "device_uuid": made.device_uuid,
        "owner_id": owner.pk,
        "holder": holder,
        "allocated_at": timezone.now(),
        "released_at": None,
        "release_reason": "",
    }
    columns = ", ".join(values)
    instance, inserted = batch(
        (
            f"INSERT INTO {INSTANCE} (gpu_id, profile, start, size, gi_id, ci_id, device_uuid, origin)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            [
                gpu_id,
                made.profile,
                made.start,
                made.size,
                made.gi_id,
                made.ci_id,
                made.device_uuid,
                GpuInstance.Origin.DYNAMIC,
            ],
        ),
        (
            f"INSERT INTO {SLICE} (instance_id, {columns}) VALUES"
            f" ((SELECT id FROM {INSTANCE} WHERE device_uuid = %s), {', '.join(['%s'] * len(values))}) RETURNING id",
            [made.device_uuid, *_db_values(values)],
        ),
        commit=True,
    )
    _committed(gpu_id, (model.name, Gpu.Policy.DYNAMIC, layout.with_instance(profile, start).key))
    values.update(id=inserted[0][0], instance_id=instance[0][0])
    names = [field.attname for field in Slice._meta.concrete_fields]
    return Slice.from_db(connection.alias, names, [values[name] for name in names])


def _committed(gpu_id: int, entry: tuple[str, str, str] | None) -> None:
    """Tell this thread's fleet view a GPU's (model, policy, layout key) as we just committed it.

    Only our own transactions have committed by now; inside someone else's
    atomic block the change may still roll back, and the next look reads it.
    """
    if sql.manual():
        fleetview.current().note(gpu_id, entry)


def _layout_values(layout: Layout) -> list[Any]:
    counts = Gpu._meta.get_field("profile_counts").get_db_prep_save(dict(layout.counts), connection)
    return [layout.memory_mask, layout.compute_used, counts, layout.key]


def _db_values(values: dict[str, Any]) -> list[Any]:
    adapt = connection.ops.adapt_datetimefield_value
    return [adapt(value) if isinstance(value, datetime) else value for value in values.values()]


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


def release(slice_id: int, by: User | None = None, reason: str = "released") -> None:
    """Give a slice back. ``by`` is checked: only the owner or staff may release it."""
    mine = by is not None and not by.is_staff
    with sql.transaction():
        # One round trip: mark the slice released (its row lock makes a second release wait, then
        # find nothing), then lock its GPU and read what the bookkeeping needs.
        released, found = batch(
            (
                f"UPDATE {SLICE} SET released_at = %s, release_reason = %s WHERE id = %s AND released_at IS NULL"
                + (" AND owner_id = %s" if mine else "")
                + " RETURNING gpu_id",
                [connection.ops.adapt_datetimefield_value(timezone.now()), reason[:100], slice_id]
                + ([by.pk] if mine and by else []),
            ),
            (
                f"SELECT g.id, g.uuid, g.model_name, g.layout_key, g.mig_policy, g.state, h.backend, i.id, i.profile,"
                f" i.start, i.gi_id, i.origin FROM {GPU} g JOIN {HOST} h ON h.id = g.host_id LEFT JOIN {INSTANCE} i"
                f" ON i.id = (SELECT instance_id FROM {SLICE} WHERE id = %s)"
                f" WHERE g.id = (SELECT gpu_id FROM {SLICE} WHERE id = %s)" + for_update(of="g"),
                [slice_id, slice_id],
            ),
        )
        if not released:
            _refuse_release(slice_id, by)
        gpu_id, gpu_uuid, model_name, key, policy, state, backend, instance_id, profile, start, gi_id, origin = found[0]
        statements = []
        layout = Layout.from_key(key)
        dynamic = instance_id is not None and origin == GpuInstance.Origin.DYNAMIC
        if dynamic:
            _destroy(backend, gpu_uuid, gi_id, slice_id)
            layout = layout.without_instance(catalog.model(model_name).profile(profile), start)
            statements = [
                (f"UPDATE {SLICE} SET instance_id = NULL WHERE instance_id = %s", [instance_id]),
                (f"DELETE FROM {INSTANCE} WHERE id = %s", [instance_id]),
            ]
        batch(
            *statements,
            (
                f"UPDATE {GPU} SET memory_mask = %s, compute_used = %s, profile_counts = %s, layout_key = %s,"
                " active_slices = active_slices - 1 WHERE id = %s",
                [*_layout_values(layout), gpu_id],
            ),
            commit=True,
        )
        if dynamic:
            _committed(gpu_id, (model_name, policy, layout.key) if state == Gpu.State.OK else None)


def _destroy(backend: str, gpu_uuid: str, gi_id: int, slice_id: int) -> None:
    """Have the driver destroy a released slice's instance; one it no longer has is already what we want."""
    try:
        backend_for_host(backend).destroy_instance(gpu_uuid, gi_id)
    except BackendError as error:
        if error.code != "not_found":
            raise
        log.warning("slice %s: GPU instance %s on %s was already gone (%s)", slice_id, gi_id, gpu_uuid, error)


def _refuse_release(slice_id: int, by: User | None) -> None:
    taken = Slice.objects.filter(pk=slice_id).values_list("owner_id", "released_at").first()
    if taken is None or (by is not None and taken[0] != by.pk and not by.is_staff):
        raise ReleaseRefused("No such slice among yours.")
    raise ReleaseRefused("This slice was already released.")


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
