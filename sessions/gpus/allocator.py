"""Handing out slices of GPUs and taking them back: ``allocate`` and ``release``, and the MIG placement.

The request's checks are ``sessions.gpus.requests``, the pools' turns ``sessions.gpus.turns``, whole GPUs
and shares ``sessions.gpus.whole``, a spot slice to reclaim ``sessions.gpus.reclaim``, and how much more fits
``sessions.gpus.capacity``; what the portal needs of them it imports from here.

Both run inside their caller's transaction (a launch's, a session end's), with
Django's ORM and, on the hot path, a few plain statements that go to
PostgreSQL together and prepared (``sessions.gpus.statements``).

Exact under concurrency: requests for the same pool (MIG GPUs of one model,
whole GPUs, time-sliced GPUs) take turns on a transaction-long advisory lock,
so each decides on what every request before it committed; a request is
refused only when no GPU could take it once those requests in flight are
done. Taking turns also keeps GPU row locks in one order, so no two requests
can deadlock. Releases need no turn: they only ever add room, and the GPU
row lock they take (a claim waits for it, never ``SKIP LOCKED``, and then
checks the layout again) keeps each GPU's bookkeeping exact. The owner's row
is locked too, which queues one person's parallel requests for the
per-person limit. Partial unique constraints back all of this up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from sessions.gpus import agency, catalog, demand, orders, packing, placement, statements, workloads
from sessions.gpus.capacity import free_capacity
from sessions.gpus.catalog import GpuModel, Profile
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, HostOrder, Slice, SliceQuota
from sessions.gpus.placement import Layout
from sessions.gpus.reclaim import reclaimable
from sessions.gpus.requests import (
    AllocationRefused,
    ReleaseRefused,
    SliceRequest,
    checked,
    gpus_for,
    models_for,
    new_slice,
    no_capacity_message,
    refuse_if_hosts_away,
)
from sessions.gpus.turns import hold_every_pool, pools, take_turn, turn
from sessions.gpus.whole import allocate_gpu

__all__ = [
    "AllocationRefused",
    "ReleaseRefused",
    "SliceRequest",
    "allocate",
    "hold_every_pool",
    "reclaimable",
    "release",
    "take_turn",
]

log = logging.getLogger(__name__)
Rule = Callable[[GpuModel, Sequence[tuple[Any, Layout]], Profile], tuple[Any, int] | None]
GPU, HOST, INSTANCE = Gpu._meta.db_table, GpuHost._meta.db_table, GpuInstance._meta.db_table
SLICE, USER, QUOTA = Slice._meta.db_table, User._meta.db_table, SliceQuota._meta.db_table
ORDER = HostOrder._meta.db_table


def allocate(owner: User, request: SliceRequest, holder: Holder | None = None, rule: Rule | None = None) -> Slice:
    """A slice for ``owner``, inside the caller's transaction (or one of its own).

    For a workload (``holder``) only once the gate lets it start: AllocationRefused with code ``credit`` says
    why not. ``rule`` places MIG instances; by default ours, weighed by the demand each model has seen.
    """
    request = checked(request)
    with _transaction():
        if holder is not None:
            _gate(owner, request, holder)
        limit, held, groups = _first_look(owner, request)
        if held >= limit:
            raise AllocationRefused(f"You already hold {limit} slice(s), your limit; stop one first.", code="quota")
        if request.kind == Slice.Kind.MIG:
            return _allocate_mig(owner, request, holder, rule or _learned_rule, groups)
        return allocate_gpu(owner, request, holder)


def _gate(owner: User, request: SliceRequest, holder: Holder) -> None:
    """A workload's slice only if whoever bills lets it start (``workloads.gate``), asked under the owner's row
    lock (taken before any pool's turn, the order of every allocation), so two allocations of one person's at
    once never both spend the same credit."""
    User.objects.select_for_update().filter(pk=owner.pk).first()
    refusal = workloads.gate().refusal(owner, request, holder)
    if refusal:
        raise AllocationRefused(refusal, code="credit")


def _learned_rule(
    model: GpuModel, candidates: Sequence[tuple[Any, Layout]], profile: Profile
) -> tuple[Any, int] | None:
    """``placement.by_history`` as the portal runs it, the demand kept per process (``sessions.gpus.demand``)."""
    learned = demand.for_model(model.name)
    if learned is None:  # too few requests seen to trust their demand
        return placement.first_fit(model, candidates, profile)
    return placement.choose(model, candidates, profile, learned)


@contextmanager
def _transaction() -> Iterator[None]:
    """The caller's transaction as it is, or one of our own.

    No savepoint (two round trips each call): every refusal comes before anything is written,
    or undoes what was (``_made``), so a caller may catch it and go on in its transaction.
    """
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        yield


def _first_look(owner: User, request: SliceRequest) -> tuple[int, int, list[tuple[Any, ...]]]:
    """Take our turn, lock the owner, and read their limit, the slices they hold and (for MIG) where it may go.

    One round trip on PostgreSQL. The turn is a transaction-long advisory lock per pool (MIG GPUs of one
    model, whole GPUs, time-sliced GPUs), taken in the keys' order so requests needing several pools never
    wait on each other in a circle; SQLite runs one writing transaction at a time anyway. The owner's row
    lock queues one person's parallel requests for their limit, across pools.
    """
    looks: list[tuple[str, Sequence[Any]]] = []
    turns = connection.vendor == "postgresql"
    if turns:
        looks.append(turn(pools(request)))
    lock = " FOR NO KEY UPDATE OF u" if connection.features.has_select_for_update_of else ""
    user = f"SELECT q.max_slices FROM {USER} u LEFT JOIN {QUOTA} q ON q.user_id = u.id WHERE u.id = %s{lock}"
    looks.append((user, [owner.pk]))
    looks.append((f"SELECT count(*) FROM {SLICE} WHERE owner_id = %s AND released_at IS NULL", [owner.pk]))
    if request.kind == Slice.Kind.MIG:
        looks.append(_groups_sql(request))
    quota, held, *groups = statements.run(*looks)[1 if turns else 0 :]
    limit = int(settings.MAX_SLICES_PER_USER) if not quota or quota[0][0] is None else int(quota[0][0])
    return limit, int(held[0][0]), groups[0] if groups else []


def _groups_sql(request: SliceRequest) -> tuple[str, list[Any]]:
    """The distinct (model, policy, layout) among working MIG GPUs where the profile may fit, per host, first
    GPU first, each with its host's load (on a fleet of one host: None).

    A fleet of a thousand GPUs has far fewer distinct layouts, and any GPU of a layout is as good as another
    on its host; between hosts, PORTAL_PLACEMENT chooses (``sessions.gpus.packing``) by the load, read here so
    that choosing costs no round trip of its own.
    """
    fits, params = [], []
    for model in models_for(request):
        fits.append("(model_name = %s AND (mig_policy = 'static' OR compute_used <= %s))")
        params += [model.name, model.compute_slices - model.profile(request.profile).compute_slices]
    where = f"sharing = 'mig' AND state = 'ok' AND ({' OR '.join(fits) or 'FALSE'})"
    where += f" AND host_id IN (SELECT id FROM {HOST} WHERE state = 'up')"  # not draining, not lost
    if request.host:
        where += f" AND host_id IN (SELECT id FROM {HOST} WHERE name = %s)"
        params.append(request.host)
    layouts = (
        f"SELECT model_name, mig_policy, layout_key, min(id) AS first, host_id FROM {GPU} WHERE {where}"
        " GROUP BY model_name, mig_policy, layout_key, host_id"  # the key holds compute_used
    )
    # A host's load is the slices all its GPUs hold, of every kind: one grouped scan, joined to the layouts'
    # few rows (a sum per row would scan a host's GPUs once per layout). On a fleet of one host, the one-time
    # filter skips the scan.
    loads = (
        f"SELECT host_id, sum(active_slices) AS held FROM {GPU}"
        f" WHERE (SELECT count(*) FROM {HOST}) > 1 GROUP BY host_id"
    )
    sql = (
        "SELECT model_name, mig_policy, layout_key, first, host_id, held"
        f" FROM ({layouts}) layouts LEFT JOIN ({loads}) loads USING (host_id) ORDER BY first"
    )
    return sql, params


def _allocate_mig(
    owner: User, request: SliceRequest, holder: Holder | None, rule: Rule, groups: list[tuple[Any, ...]]
) -> Slice:
    models = models_for(request)
    for model in models:
        taken = _place(owner, request, model, model.profile(request.profile), holder, rule, groups)
        if taken:
            return taken
    mig = gpus_for(request, Gpu.Sharing.MIG, any_host=True).filter(model_name__in=[model.name for model in models])
    if not mig.exists():
        where = f" on {request.model}" if request.model else " in the fleet"
        raise AllocationRefused(f"No MIG GPU{where} has the profile {request.profile!r}.", code="unknown_profile")
    refuse_if_hosts_away(mig, f"a MIG GPU with {request.profile}")
    free = {name: count for name, count in free_capacity(request.model or None).items() if count}
    raise AllocationRefused(no_capacity_message(request.profile, free), free=free)


def _place(
    owner: User,
    request: SliceRequest,
    model: GpuModel,
    profile: Profile,
    holder: Holder | None,
    rule: Rule,
    groups: list[tuple[Any, ...]],
) -> Slice | None:
    """A free instance of a static layout if there is one, else a new instance where the rule says.

    A claim that finds its layout changed by a release meanwhile (the GPU's row lock) looks again;
    each such miss means the fleet changed, so the loop ends.
    """
    while True:
        firsts, static = _firsts(groups, model)
        if static:
            taken = _take_layout_instance(owner, request, profile, holder)
            if taken:
                return taken
        choice = rule(model, [(key, Layout.from_key(key)) for key in firsts], profile)
        if choice is None:
            return None
        key, start = choice
        claimed = _claim(firsts[key], Layout.from_key(key), profile, start)
        if claimed:
            return _made(owner, request, profile, start, claimed, holder)
        groups = statements.run(_groups_sql(request))[0]


def _firsts(groups: list[tuple[Any, ...]], model: GpuModel) -> tuple[dict[str, int], bool]:
    """The GPU to claim for each dynamic layout of the model (on several hosts: on the host PORTAL_PLACEMENT
    fills first), and whether any static layout may hold the profile."""
    on_hosts: dict[str, list[tuple[int, int]]] = {}
    load: dict[int, int] = {}
    static = False
    for name, policy, key, first, host, held in groups:
        if name == model.name:
            if policy == Gpu.Policy.DYNAMIC:
                on_hosts.setdefault(key, []).append((first, host))
                load[host] = int(held or 0)
            else:
                static = True
    if len(load) <= 1:  # one host: nothing to choose
        return {key: min(pairs)[0] for key, pairs in on_hosts.items()}, static
    return {key: packing.first_by_host(pairs, load) for key, pairs in on_hosts.items()}, static


def _take_layout_instance(owner: User, request: SliceRequest, profile: Profile, holder: Holder | None) -> Slice | None:
    """A free instance of this profile in a static layout, its GPU locked and the instance checked free again."""
    static = gpus_for(request, Gpu.Sharing.MIG).filter(mig_policy=Gpu.Policy.STATIC)
    in_use = Slice.objects.filter(instance=OuterRef("pk"), released_at__isnull=True)
    free = GpuInstance.objects.filter(origin=GpuInstance.Origin.LAYOUT, profile=profile.name, gpu__in=static)
    free = free.filter(~Exists(in_use)).order_by("gpu_id", "start")
    while (candidate := free.values_list("gpu_id", flat=True).first()) is not None:
        # The GPU's row lock queues the requests placing on it; a look after the lock sees what they made.
        gpu = Gpu.objects.select_for_update(of=("self",), no_key=True).get(pk=candidate)
        instance = free.filter(gpu_id=gpu.pk).first()
        if instance is not None:
            gpu.active_slices += 1
            gpu.save(update_fields=["active_slices"])
            return _record(owner, request, gpu, instance, profile, holder)
    return None


def _claim(gpu_id: int, layout: Layout, profile: Profile, start: int) -> tuple[int, int, str] | None:
    """Lock the GPU, the first of its layout, and write its new layout, in one statement.

    Our turn keeps other allocations off the pool, so only a release can have changed the GPU since the
    look: the update waits for its row lock, checks the layout again and, if it changed, writes nothing
    (the caller looks again). Returns (GPU id, host id, host name), or None.

    By primary key: no index holds the layout columns, so claims and releases are HOT updates that
    leave every index of the table alone (measured: see bench/results/notes.md, issue 12).
    """
    after = layout.with_instance(profile, start)
    claimed = statements.rows(
        f"UPDATE {GPU} SET memory_mask = %s, compute_used = %s, profile_counts = %s, layout_key = %s,"
        " active_slices = active_slices + 1"
        " WHERE id = %s AND layout_key = %s AND state = 'ok' AND sharing = 'mig' AND mig_policy = 'dynamic'"
        f" RETURNING id, host_id, (SELECT name FROM {HOST} WHERE id = host_id)",
        [*_layout_values(after), gpu_id, layout.key],
    )
    return (int(claimed[0][0]), int(claimed[0][1]), str(claimed[0][2])) if claimed else None


def _made(
    owner: User,
    request: SliceRequest,
    profile: Profile,
    start: int,
    claimed: tuple[int, int, str],
    holder: Holder | None,
) -> Slice:
    """Record the slice on the claimed room and the order for its instance, which the host's agent alone
    makes (``sessions.gpus.orders``): the slice's device is known once it has (``orders.wait_for_slice``)."""
    gpu_id, host_id, host = claimed
    taken = new_slice(owner, request, gpu_id, holder, "", profile.compute_slices, profile.memory_gib)
    taken.profile, taken.placement_start, taken.placement_size = profile.name, start, profile.placement_size
    order = orders.to_create(host_id, gpu_id, profile.name, start)
    [(order_id, taken.pk)] = _recorded(taken, order)
    orders.submitted(host, order_id)
    if agency.is_agent_of(host):  # made already, in this transaction
        taken.refresh_from_db(fields=["instance", "device_uuid"])
    return taken


def _recorded(taken: Slice, order: HostOrder) -> list[tuple[Any, ...]]:
    """The slice's row and its order's, the order taking the slice's new id. On
    PostgreSQL one statement, whose WITH inserts the slice; SQLite has no such WITH. Returns (order id, slice id)."""
    slice_sql, slice_params = statements.insert(taken)
    if connection.vendor != "postgresql":
        order.slice_id = statements.rows(slice_sql, slice_params)[0][0]
        order_sql, order_params = statements.insert(order)
        return statements.rows(f"{order_sql}, slice_id", order_params)
    order_sql, order_params = statements.insert(order, slice="(SELECT id FROM taken)")
    return statements.rows(f"WITH taken AS ({slice_sql}) {order_sql}, slice_id", [*slice_params, *order_params])


def _mig_slice(
    owner: User,
    request: SliceRequest,
    gpu_id: int,
    holder: Holder | None,
    profile: Profile,
    placed: GpuInstance,
) -> Slice:
    taken = new_slice(owner, request, gpu_id, holder, placed.device_uuid, profile.compute_slices, profile.memory_gib)
    taken.profile, taken.placement_start, taken.placement_size = profile.name, placed.start, placed.size
    return taken


def _layout_values(layout: Layout) -> list[Any]:
    counts = Gpu._meta.get_field("profile_counts").get_db_prep_save(dict(layout.counts), connection)
    return [layout.memory_mask, layout.compute_used, counts, layout.key]


def _record(
    owner: User, request: SliceRequest, gpu: Gpu, instance: GpuInstance, profile: Profile, holder: Holder | None
) -> Slice:
    taken = _mig_slice(owner, request, gpu.pk, holder, profile, instance)
    taken.instance = instance
    taken.save(force_insert=True)
    return taken


def release(slice_id: int, reason: str = "released") -> None:
    """Give a slice back, inside the caller's transaction (or one of its own). Who may is the caller's
    question (``sessions.access``): the services ask it before they end what holds the slice.

    Two round trips on PostgreSQL: lock the slice and its GPU, then write it all. A dynamic instance's end is
    an order for the host's agent (``sessions.gpus.orders``), written with the rest and recorded after the
    create that made it, so the agent destroys it before any later create reuses its room; the room is free for the
    allocator at once. Releases need no turn (they only ever add room); the GPU's row lock keeps its
    bookkeeping exact against a parallel claim, which waits for it and then checks again.
    """
    lock = " FOR NO KEY UPDATE OF s, g" if connection.features.has_select_for_update_of else ""
    with _transaction():
        # The slice and its GPU locked in one statement. A second release of the same slice waits for this
        # one's lock, then finds it released and returns nothing; a claim on the GPU meanwhile is waited
        # for, and its layout is the one read (READ COMMITTED reads a locked row again once it is free).
        # The instance is read from the slice's own row: if the agent recorded it while this waited for the lock,
        # the locked row is read again and names it, where the joined instance row (not locked, and made after
        # this statement began) would still read as absent and be left behind.
        found = statements.rows(
            "SELECT g.id, g.model_name, g.memory_mask, g.compute_used, g.profile_counts, h.id, h.name,"
            f" s.instance_id, i.gi_id, i.origin, o.id, s.profile, s.placement_start FROM {SLICE} s"
            f" JOIN {GPU} g ON g.id = s.gpu_id"
            f" JOIN {HOST} h ON h.id = g.host_id"
            f" LEFT JOIN {INSTANCE} i ON i.id = s.instance_id"
            f" LEFT JOIN {ORDER} o ON o.slice_id = s.id AND o.action = 'create'"
            f" WHERE s.id = %s AND s.released_at IS NULL{lock}",
            [slice_id],
        )
        if not found:
            _refuse_release(slice_id)
            return
        (
            gpu_id,
            model_name,
            mask,
            compute,
            counts,
            host_id,
            host,
            instance_id,
            gi_id,
            origin,
            made_by,
            profile,
            start,
        ) = found[0]
        moment = Slice._meta.get_field("released_at").get_db_prep_save(timezone.now(), connection)
        # A dynamic instance is made for its one slice and goes with it (the deferred foreign key would
        # refuse the commit if any other slice still pointed at it); a static layout's instance stays.
        dynamic = made_by is not None or origin == GpuInstance.Origin.DYNAMIC  # (or made before instances were orders)
        gone = ", instance_id = NULL" if dynamic else ""
        released = (
            f"UPDATE {SLICE} SET released_at = %s, release_reason = %s{gone} WHERE id = %s",
            [moment, reason[:100], slice_id],
        )
        writes: list[tuple[str, Sequence[Any]]] = [released]
        if not dynamic:
            writes.append((f"UPDATE {GPU} SET active_slices = active_slices - 1 WHERE id = %s", [gpu_id]))
            statements.run(*_written_together(writes))
        else:
            counts = json.loads(counts) if isinstance(counts, str) else counts  # SQLite and psycopg give text
            layout = Layout(mask, compute, tuple(sorted(counts.items())))
            after = layout.without_instance(catalog.model(model_name).profile(profile), start)
            gpu_written = (
                f"UPDATE {GPU} SET memory_mask = %s, compute_used = %s, profile_counts = %s, layout_key = %s,"
                " active_slices = active_slices - 1 WHERE id = %s",
                [*_layout_values(after), gpu_id],
            )
            if instance_id is not None:
                writes.append((f"DELETE FROM {INSTANCE} WHERE id = %s", [instance_id]))
            writes.append(gpu_written)
            destroy = orders.to_destroy(host_id, gpu_id, gi_id, undoes=made_by)
            writes.append(statements.insert(destroy))  # last: its id comes back
            [(order_id,)] = statements.run(*_written_together(writes))[-1]
            orders.submitted(host, order_id)


def _written_together(writes: list[tuple[str, Sequence[Any]]]) -> list[tuple[str, Sequence[Any]]]:
    """The writes as one statement on PostgreSQL (each a data-modifying WITH of the last): one statement's
    work for the client and the server instead of three. SQLite takes them one by one."""
    if connection.vendor != "postgresql" or len(writes) < 2:
        return writes
    *first, (last_sql, _) = writes
    with_parts = ", ".join(f"w{number} AS ({sql})" for number, (sql, _) in enumerate(first))
    params = [value for _, values in writes for value in values]
    return [(f"WITH {with_parts} {last_sql}", params)]


def _refuse_release(slice_id: int) -> None:
    if not Slice.objects.filter(pk=slice_id).exists():
        raise ReleaseRefused(f"There is no slice {slice_id}.")
    raise ReleaseRefused("This slice was already released.")
