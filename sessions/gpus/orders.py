"""Changes to a host's GPUs as orders that only the host's agent carries out (issue 31).

Whoever decides a change records it as a ``HostOrder`` in the same transaction: the allocator a MIG instance
for a slice it claimed, a release the instance's end, an operator a static layout. The agent of the GPU's host
(``sessions.gpus.agency``; ``manage.py gpu_agent`` on that machine) claims each one, carries it out through its
own driver and records the result, all in one transaction; the process that asked waits for it outside its
transaction (``wait``), with a deadline, and gives up at once when the host's heartbeat is stale.

Orders ride the database, not the broker: an order is recorded exactly when the decision that needs it
commits (a queue message sent on commit can be lost between the two, and one sent before can outrun a
rollback), it survives an agent's restart as a row the next agent finds, the device's answer lands in the same
transaction as the rows it changes, and PostgreSQL's ``LISTEN``/``NOTIFY`` wakes the agent as soon as the
order commits (``wake``, sent just after), so no queue is polled. An agent claims with ``FOR NO KEY UPDATE
SKIP LOCKED`` (not ``FOR UPDATE``: a release recording its destroy, whose key refers to the create, must not
wait for the agent carrying that create out, which waits for the slice the release holds) and only the oldest
pending order of a GPU, so one GPU's orders run in the order they were decided (a destroy before the create
that reuses its room) while different GPUs' run side by side.

Exactly once: a crash before the result is recorded rolls the claim back, and the order is pending again. The
next try first asks the device what is at the order's placement (a MIG placement holds one instance), and a
create that finds its instance made adopts it: retried, it never makes a second. Where this process is itself
the host's agent (the agent's own work, the test suite, the benchmarks), an order is carried out at once, in
the transaction that recorded it.
"""

from __future__ import annotations

import json
import logging
import select
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
from django.conf import settings
from django.db import close_old_connections, connection, connections, transaction
from django.utils import timezone

from portal.clock import database_now
from sessions.gpus import agency, placement, statements
from sessions.gpus.backends import BackendError, backend_for_host
from sessions.gpus.backends.base import FoundInstance, GpuBackend
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, HostOrder, Slice

log = logging.getLogger(__name__)
Action, OrderState = HostOrder.Action, HostOrder.State
CHANNEL = "gpu_host_orders"
POLL_S = 0.05  # how often a waiter looks at its order
IDLE_POLL_S = 1.0  # an agent's look for orders when no notice woke it (SQLite, a lost notice)
DISCOVER_EVERY_S = 300.0  # the agent's discovery of its hosts: a GPU that vanished or came back shows
ORDER, INSTANCE, SLICE = HostOrder._meta.db_table, GpuInstance._meta.db_table, Slice._meta.db_table
GPU, HOST, INDEX = Gpu._meta.db_table, GpuHost._meta.db_table, '"index"'  # a word SQL reserves


class OrderFailed(Exception):
    """The order was not carried out; ``reason`` says why in words its owner can act on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def to_create(host_id: int, gpu_id: int, profile: str, start: int) -> HostOrder:
    """The order (unsaved) for a claimed slice's MIG instance: the allocator records it with the slice, in one
    statement, and then calls ``submitted``."""
    return HostOrder(host_id=host_id, gpu_id=gpu_id, action=Action.CREATE, profile=profile, start=start)


def submitted(host: str, order_id: int) -> None:
    """An order was recorded: carried out at once where this process is the host's agent (in the transaction
    that recorded it), else by the agent once that commits, which the agent hears of (``wake``)."""
    if agency.is_agent_of(host):
        carry_out(order_id)
    elif connection.vendor == "postgresql":
        transaction.on_commit(wake, robust=True)  # a notice that fails is logged: the order stands, looked at in 1 s


def wake() -> None:
    """Tell the agents listening (``LISTEN gpu_host_orders``) that an order committed: a notice of its own, in a
    transaction of its own, after the order's commit.

    Not sent by the transaction that records the order (as a trigger would): PostgreSQL writes notices in
    commit order under one lock held until the commit is on disk, so every allocation and release would commit
    one after another, each waiting for the disk (measured: 8 processes at once made half as many pairs per
    second). This transaction writes nothing else and does not wait for the disk (``synchronous_commit``
    off): a notice lost in a crash costs an agent at most its second's look (``IDLE_POLL_S``)."""
    with connection.cursor() as cursor:  # one round trip: no parameters, so one simple query of four statements
        cursor.execute(f"BEGIN; SET LOCAL synchronous_commit TO OFF; NOTIFY {CHANNEL}; COMMIT")


def to_destroy(host_id: int, gpu_id: int, gi_id: int | None, undoes: int | None) -> HostOrder:
    """The order (unsaved) for the end of a released slice's instance: ``gi_id`` if it was made, else the create
    it ``undoes`` (whose result the agent reads when it gets there, after carrying that create out). The release
    records it with its own writes, in one statement, and then calls ``submitted``."""
    return HostOrder(host_id=host_id, gpu_id=gpu_id, action=Action.DESTROY, gi_id=gi_id, undoes_id=undoes)


def apply_layout(gpu: Gpu, layout: Sequence[tuple[str, int]]) -> HostOrder:
    """Record a static layout for an idle GPU (empty: no instance at all); the caller waits for it."""
    order = HostOrder.objects.create(
        host_id=gpu.host_id, gpu=gpu, action=Action.LAYOUT, layout=[[name, start] for name, start in layout]
    )
    submitted(gpu.host.name, order.pk)
    return order


def carry_out(order_id: int) -> bool:
    """Carry out one pending order as its host's agent (in the caller's transaction, or one of its own);
    False if it was not pending (done already, or another agent holds it) or an earlier order of its GPU
    still waits (the agent's executor carries them out in turn)."""
    with transaction.atomic():
        order = _claimed("o.id = %s", [order_id])
        if order is None:
            return False
        _carried_out(order)
        return True


def carry_out_next(hosts: Iterable[str] | None = None) -> bool:
    """As the agent of ``hosts`` (None: every host this process acts for), carry out the oldest order it may
    take: the oldest pending one of its GPU, not held by another agent. False when there is none."""
    return carry_out_some(hosts, 1) == 1


BATCH = 16  # orders an agent carries out in one transaction when that many wait


def carry_out_some(hosts: Iterable[str] | None = None, most: int = BATCH) -> int:
    """Carry out up to ``most`` orders as ``carry_out_next`` would, one after another, in one transaction: how
    many. Orders that come in a burst share one commit (measured: a commit and its round trips were a third of
    an order's cost to the agent, on the two cores the web processes need too); a failure undoes the batch,
    whose orders are then taken again (a create adopts the instance an undone try made). An order is done, for
    whoever waits for it, when its batch commits: at most ``BATCH`` orders later."""
    names = agency.hosts() if hosts is None else list(hosts)
    if agency.EVERY_HOST in names:
        where = "1 = 1"
    elif len(names) == 1:  # the usual agent: one value, so the host's pending orders are read in order, no sort
        where = f"o.host_id = (SELECT id FROM {HOST} WHERE name = %s)"
    else:
        where = f"h.name IN ({', '.join(['%s'] * len(names)) or 'NULL'})"
    done = 0
    with transaction.atomic():
        while done < most:
            order = _claimed(where, [] if agency.EVERY_HOST in names else names)
            if order is None or not agency.is_agent_of(order.host.name):
                break  # none waits; or this process stopped acting for its host since the batch began: it waits
            _carried_out(order)
            done += 1
    return done


ORDER_FIELDS = ("id", "action", "profile", "start", "layout", "gi_id", "device_uuid", "slice_id", "undoes_id")


def _claimed(where: str, params: list[Any]) -> HostOrder | None:
    """The oldest pending order matching ``where`` (on ``o``, its host ``h``) that is the first pending one of
    its GPU and that no other agent holds, locked for this transaction; with what carrying it out reads of its
    GPU, its host and (a destroy) the create it undoes. One plain statement, prepared once an agent has sent it
    a few times: an agent looks for orders after each one it carries out, so this is its most frequent query."""
    lock = " FOR NO KEY UPDATE OF o SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    found = statements.rows(
        f"SELECT {', '.join(f'o.{field}' for field in ORDER_FIELDS)}, o.gpu_id, g.uuid, g.model_name, g.{INDEX},"
        f" o.host_id, h.name, h.backend, u.state, u.gi_id FROM {ORDER} o JOIN {GPU} g ON g.id = o.gpu_id"
        f" JOIN {HOST} h ON h.id = o.host_id LEFT JOIN {ORDER} u ON u.id = o.undoes_id"
        f" WHERE o.state = 'pending' AND {where} AND NOT EXISTS (SELECT 1 FROM {ORDER} e"
        f" WHERE e.gpu_id = o.gpu_id AND e.state = 'pending' AND e.id < o.id) ORDER BY o.id LIMIT 1{lock}",
        params,
    )
    if not found:
        return None
    values = found[0]
    order = HostOrder(**dict(zip(ORDER_FIELDS, values[: len(ORDER_FIELDS)], strict=True)))
    if isinstance(order.layout, str):  # psycopg gives jsonb as text on Django's connections
        order.layout = json.loads(order.layout)
    gpu_id, uuid, model_name, index, host_id, name, backend, undone, undone_gi = values[len(ORDER_FIELDS) :]
    order.host = GpuHost(pk=host_id, name=name, backend=backend)
    order.gpu = Gpu(pk=gpu_id, uuid=uuid, model_name=model_name, index=index, host=order.host)
    if order.undoes_id is not None:
        order.undoes = HostOrder(pk=order.undoes_id, state=undone, gi_id=undone_gi)
    return order


def _carried_out(order: HostOrder) -> None:
    """Carry the order out and record its result. A create or destroy sends its writes and the order's result
    together (``statements.together``: one round trip on PostgreSQL after the device is read)."""
    agency.require(order.host.name, f"order {order.pk}")
    if settings.MIG_LAYOUT == "cluster":  # mig-manager's layout: this agent changes no instance, whoever asks
        log.warning("order %s (%s on %s) refused: the node's MIG layout is the cluster's", order.pk, order.action,
                    order.gpu)  # fmt: skip
        _finished(order, OrderState.FAILED, "this node's MIG layout is the cluster's (PORTAL_MIG_LAYOUT=cluster)")
        return
    try:
        backend = backend_for_host(order.host.backend)
        if order.action == Action.LAYOUT:
            with transaction.atomic():  # a device that refuses part of a layout leaves the rows as they were
                _apply_layout(order, backend)
            _finished(order, OrderState.DONE)
            return
        with statements.together():
            if order.action == Action.CREATE:
                _create(order, backend)
            else:
                _destroy(order, backend)
            _finished(order, OrderState.DONE)
    except BackendError as error:
        log.warning("order %s (%s on %s) refused by the device: %s", order.pk, order.action, order.gpu, error)
        _finished(order, OrderState.FAILED, str(error)[:2000])


def _finished(order: HostOrder, state: str, error: str = "") -> None:
    order.state, order.error, order.done_at = state, error, timezone.now()
    done_at = HostOrder._meta.get_field("done_at").get_db_prep_save(order.done_at, statements.database())
    statements.queue(
        f"UPDATE {ORDER} SET state = %s, error = %s, gi_id = %s, device_uuid = %s, done_at = %s WHERE id = %s",
        [order.state, order.error, order.gi_id, order.device_uuid, done_at, order.pk],
    )


def _create(order: HostOrder, backend: GpuBackend) -> None:
    """Make the instance, or adopt the one a try that died before recording it made (the same placement)."""
    gpu, start = order.gpu, int(order.start or 0)
    profile = gpu.catalog_model.profile(order.profile)
    present = backend.instances(gpu.uuid)
    there = next((found for found in present if found.start == start), None)
    if there is not None and there.profile != profile.name:
        raise BackendError(f"memory slice {start} holds a {there.profile} instance already", "insufficient_resources")
    made = there or backend.create_instance(gpu.uuid, profile, start, present=present)
    order.gi_id, order.device_uuid = made.gi_id, made.device_uuid
    if there is not None:
        log.info("order %s: adopted GPU instance %s on %s, made by an earlier try", order.pk, made.gi_id, gpu)
    _record_instance(order, made)


def _record_instance(order: HostOrder, made: FoundInstance) -> None:
    """The instance's row, and its slice's device, while the slice is held; a slice released meanwhile has a
    destroy order after this one, which reads the instance from this order.

    Two statements with no answer awaited between them: the first locks the slice (a release of it meanwhile
    is waited for, and then seen: it records its destroy after this) and records the instance only if it is
    still held and has none; the second points the slice at it under the same conditions."""
    columns, marks, values = statements.row_values(GpuInstance.of(order.gpu_id, made, GpuInstance.Origin.DYNAMIC))
    held = "id = %s AND released_at IS NULL AND instance_id IS NULL"
    lock = " FOR NO KEY UPDATE" if connection.features.has_select_for_update else ""
    statements.queue(
        f"INSERT INTO {INSTANCE} ({columns}) SELECT {marks} WHERE EXISTS (SELECT 1 FROM {SLICE} WHERE {held}{lock})",
        [*values, order.slice_id or 0],
    )
    statements.queue(
        f"UPDATE {SLICE} SET device_uuid = %s, instance_id = (SELECT id FROM {INSTANCE} WHERE device_uuid = %s)"
        f" WHERE {held}",
        [made.device_uuid, made.device_uuid, order.slice_id or 0],
    )


def _destroy(order: HostOrder, backend: GpuBackend) -> None:
    gi_id = order.gi_id
    if gi_id is None and order.undoes is not None:  # its create ran first (one GPU's orders run in turn)
        gi_id = order.gi_id = order.undoes.gi_id if order.undoes.state == OrderState.DONE else None
    if gi_id is None:
        return  # its create was given up or refused: nothing was made
    try:
        backend.destroy_instance(order.gpu.uuid, gi_id)
    except BackendError as error:
        if error.code != "not_found":
            raise
        log.info("order %s: GPU instance %s on %s was gone already", order.pk, gi_id, order.gpu)


def _apply_layout(order: HostOrder, backend: GpuBackend) -> None:
    gpu = Gpu.objects.select_for_update().get(pk=order.gpu_id)
    for found in backend.instances(gpu.uuid):
        backend.destroy_instance(gpu.uuid, found.gi_id)
    gpu.instances.all().delete()
    model = gpu.catalog_model
    for name, start in sorted(order.layout, key=lambda item: item[1]):
        GpuInstance.record(
            gpu, backend.create_instance(gpu.uuid, model.profile(name), start), GpuInstance.Origin.LAYOUT
        )
    recount(gpu)
    gpu.save()


def recount(gpu: Gpu) -> None:
    """Rebuild the GPU's bookkeeping from its instances and active slices (caller saves)."""
    layout = placement.Layout()
    if gpu.mig_capable and gpu.state != Gpu.State.ERROR:
        model = gpu.catalog_model
        for instance in gpu.instances.all():
            layout = layout.with_instance(model.profile(instance.profile), instance.start)
    gpu.set_layout(layout)
    gpu.active_slices = gpu.slices.filter(released_at__isnull=True).count()


def unfinished(gpu: Gpu) -> bool:
    """Whether the GPU has orders its agent has not carried out yet (discovery leaves such a GPU be)."""
    return HostOrder.objects.filter(gpu=gpu, state=OrderState.PENDING).exists()


# Waiting for an order, outside the transaction that recorded it.


def wait_for_slice(slice_id: int, deadline_s: float | None = None) -> None:
    """Return once the slice's device is made (at once for a slice that needed none); OrderFailed says why not."""
    order_id = (
        HostOrder.objects.filter(slice_id=slice_id, action=Action.CREATE).order_by("-pk").values_list("pk", flat=True)
    ).first()
    if order_id is not None:
        wait(order_id, deadline_s)


def wait_for_gpu(gpu_id: int, deadline_s: float | None = None) -> None:
    """Return once the GPU's latest order (an operator's layout, say) is done, at once if it has none."""
    order_id = HostOrder.objects.filter(gpu_id=gpu_id).order_by("-pk").values_list("pk", flat=True).first()
    if order_id is not None:
        wait(order_id, deadline_s)


def wait(order_id: int, deadline_s: float | None = None) -> HostOrder:
    """The order once done. OrderFailed when the device refused it, or when the host's agent is silent (at
    once, its heartbeat older than three ``PORTAL_HOST_HEARTBEAT_S``) or has not got to it by the deadline
    (``PORTAL_HOST_ORDER_DEADLINE_S``): the order is then cancelled unless the agent holds it, in which case its
    result stands and the caller's undo (a release) is ordered after it."""
    deadline_s = float(settings.HOST_ORDER_DEADLINE_S if deadline_s is None else deadline_s)
    give_up_at = time.monotonic() + deadline_s
    while True:
        order = HostOrder.objects.select_related("host", "gpu").get(pk=order_id)
        if order.state == OrderState.DONE:
            return order
        if order.state != OrderState.PENDING:
            raise OrderFailed(_refusal(order))
        reason = _why_not_now(order.host, give_up_at, deadline_s)
        if reason:
            if _cancel(order_id, reason) or _state(order_id) != OrderState.DONE:
                raise OrderFailed(reason)
            continue
        time.sleep(POLL_S)


def _why_not_now(host: GpuHost, give_up_at: float, deadline_s: float) -> str:
    stale_after = 3 * settings.HOST_HEARTBEAT_S
    if host.heartbeat_at is not None:
        silent = (database_now() - host.heartbeat_at).total_seconds()
        if host.state == GpuHost.State.LOST or silent > stale_after:
            return f"The agent of GPU host {host.name} has been silent for {silent:.0f} s, so the slice was not made."
    if time.monotonic() > give_up_at:
        return f"The agent of GPU host {host.name} did not make the slice within {deadline_s:.0f} s."
    return ""


def _refusal(order: HostOrder) -> str:
    if order.state == OrderState.FAILED:
        return f"GPU host {order.host.name} refused it: {order.error}"
    return order.error or f"The order for GPU host {order.host.name} was given up."


def _cancel(order_id: int, reason: str) -> bool:
    """Cancel a pending order nobody holds; False if the agent holds it or it is no longer pending."""
    with transaction.atomic():
        order = HostOrder.objects.select_for_update(skip_locked=True).filter(pk=order_id, state=OrderState.PENDING)
        return bool(order.update(state=OrderState.CANCELLED, error=reason[:2000], done_at=timezone.now()))


def _state(order_id: int) -> str:
    return str(HostOrder.objects.filter(pk=order_id).values_list("state", flat=True).get())


# The agent's side: a thread that carries out its hosts' orders as they come.


EVERY_ORDER = -1  # the executor's look after a second with no notice (or none heard at all): every order waiting


class Executor:
    """Carries out the orders of the hosts this process acts for, woken by PostgreSQL's notice of a new one
    (``LISTEN gpu_host_orders``) or, failing that, every second; and runs ``discover`` (the hosts' discovery,
    which may reclaim an instance nobody holds) at its start and every ``DISCOVER_EVERY_S``. Its own database
    connection (a thread's).

    Each order committed sends one notice (``wake``), so woken by N notices it takes at most N orders and then
    waits again, without a last look that would find nothing; the look each second (and its first, at start)
    takes every order waiting, so an order whose notice was lost waits at most a second."""

    def __init__(self, hosts: Iterable[str] | None = None, discover: Callable[[], object] | None = None) -> None:
        self.hosts = None if hosts is None else list(hosts)
        self.discover, self.discovered_at = discover, -float("inf")
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpu-orders", daemon=True)

    def start(self) -> Executor:
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stopped.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        listener, heard = None, EVERY_ORDER
        try:
            while not self.stopped.is_set():
                listener = listener or _listener()
                self._drain(heard)
                answer = _await_notice(listener, self.stopped)
                if answer is None and listener is not None:
                    listener.close()
                    listener = None  # broken: a new one at the next turn
                heard = EVERY_ORDER if answer is None else answer
        finally:
            if listener is not None:
                listener.close()
            connections.close_all()

    def _drain(self, heard: int = EVERY_ORDER) -> None:
        """Carry out ``heard`` orders, fewer if no more wait (EVERY_ORDER: all that wait)."""
        try:
            if self.discover is not None and time.monotonic() - self.discovered_at > DISCOVER_EVERY_S:
                self.discover()
                self.discovered_at = time.monotonic()
            left = heard
            while not self.stopped.is_set() and left != 0:
                most = BATCH if left == EVERY_ORDER else min(left, BATCH)
                done = carry_out_some(self.hosts, most)
                if done < most:
                    break  # no more wait
                if left != EVERY_ORDER:
                    left -= done
        except Exception:  # the database away, a flushed table: log, and look again at the next wake
            log.exception("agent: carrying out GPU orders failed; trying again")
            close_old_connections()


def _listener() -> psycopg.Connection[tuple[object, ...]] | None:
    """A connection of its own that listens for new orders (PostgreSQL); None elsewhere, or if it cannot."""
    if connection.vendor != "postgresql":
        return None
    config = connections["default"].settings_dict
    try:
        listener = psycopg.connect(
            dbname=config["NAME"],
            user=config["USER"] or None,
            password=config["PASSWORD"] or None,
            host=config["HOST"] or None,
            port=config["PORT"] or None,
            autocommit=True,
        )
        listener.execute(f"LISTEN {CHANNEL}")
    except psycopg.Error as error:
        log.warning("agent: cannot listen for GPU orders (%s); looking every %s s", error, IDLE_POLL_S)
        return None
    return listener


def _await_notice(listener: psycopg.Connection[tuple[object, ...]] | None, stopped: threading.Event) -> int | None:
    """Wait for notices of new orders, at most a second: how many came, EVERY_ORDER if none came in that second
    (or none can: no listener), None if the listener broke."""
    if listener is None:
        stopped.wait(IDLE_POLL_S if connection.vendor == "postgresql" else 0.2)
        return EVERY_ORDER
    try:
        readable, _, _ = select.select([listener.fileno()], [], [], IDLE_POLL_S)
        if not readable:
            return EVERY_ORDER
        return sum(1 for _notice in listener.notifies(timeout=0))
    except (psycopg.Error, OSError, ValueError) as error:
        log.warning("agent: the order notices stopped (%s)", error)
        stopped.wait(IDLE_POLL_S)
        return None
