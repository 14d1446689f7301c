"""The fleet as the portal records it: hosts, GPUs, the MIG instances on them, and slices.

A slice is one allocation: what a session or render job runs on. Its rows are
the truth about who holds what; the per-GPU bookkeeping columns (memory mask,
compute used, counts) are kept in step with them in the same transaction, so
the allocator can pick a GPU without reading every slice.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from sessions.gpus import catalog
from sessions.gpus.backends.base import FoundInstance
from sessions.gpus.holders import Holder, HolderKind
from sessions.gpus.placement import Layout


class GpuHost(models.Model):
    """A GPU host. Its agent beats for it every few seconds (``sessions.gpus.hosts``); the allocator places
    only on a host that is up. Draining is an operator's choice; lost is the watch's finding."""

    class Backend(models.TextChoices):
        NVML = "nvml", "NVML"
        SIMULATED = "simulated", "Simulated"

    class State(models.TextChoices):
        UP = "up", "Up"
        DRAINING = "draining", "Draining"
        LOST = "lost", "Lost"

    name = models.CharField(max_length=100, unique=True)
    backend = models.CharField(max_length=20, choices=Backend.choices)
    driver_version = models.CharField(max_length=50, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True, help_text="The last discovery that reached it.")
    problem = models.TextField(blank=True, help_text="The last discovery error, if any.")
    state = models.CharField(max_length=10, choices=State.choices, default=State.UP, db_default="up")
    state_reason = models.CharField(max_length=300, blank=True, db_default="")
    state_since = models.DateTimeField(null=True, blank=True)
    drained = models.CharField(
        max_length=200, blank=True, db_default="", help_text="Who drained it and when; empty: not drained."
    )
    node_id = models.CharField(
        max_length=100, blank=True, db_default="", help_text="The identity of the machine whose agent beats for it."
    )
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="Its agent's last heartbeat (the database's clock); never: no agent yet."
    )

    class MigLayout(models.TextChoices):
        PORTAL = "portal", "The portal's"
        CLUSTER = "cluster", "The cluster's (mig-manager)"

    # Whose MIG layout the host's GPUs have (PORTAL_MIG_LAYOUT on its agent): the portal's, which makes and
    # removes instances as slices need them, or a Kubernetes node's, which NVIDIA's mig-manager applies from a
    # node label: the portal then takes the instances it finds and never changes them.
    mig_layout = models.CharField(
        max_length=10, choices=MigLayout.choices, default=MigLayout.PORTAL, db_default=MigLayout.PORTAL
    )
    cpus = models.PositiveIntegerField(null=True, blank=True, help_text="CPUs the agent found on the host.")
    memory_mib = models.PositiveBigIntegerField(null=True, blank=True, help_text="Memory the agent found.")
    # What the Swarm says of the host's machine (sessions.runtime.swarm), when the portal runs on one.
    swarm_node = models.CharField(
        max_length=40, blank=True, db_default="", help_text="Its Swarm node's id; empty: not seen in the Swarm."
    )
    swarm_state = models.CharField(
        max_length=20, blank=True, db_default="", help_text="Its Swarm node's state (ready, down, ...)."
    )
    swarm_availability = models.CharField(
        max_length=10, blank=True, db_default="", help_text="Its Swarm node's availability (active, pause, drain)."
    )
    swarm_seen_at = models.DateTimeField(null=True, blank=True, help_text="When a Swarm manager last said so.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def simulated(self) -> bool:
        return self.backend == self.Backend.SIMULATED

    @property
    def up(self) -> bool:
        return self.state == self.State.UP


class Gpu(models.Model):
    class Sharing(models.TextChoices):
        MIG = "mig", "MIG slices"
        WHOLE = "whole", "Whole GPU"
        SHARED = "shared", "Time-sliced share"

    class Policy(models.TextChoices):
        STATIC = "static", "Static layout"
        DYNAMIC = "dynamic", "Dynamic (created per request)"

    class State(models.TextChoices):
        OK = "ok", "OK"
        MISSING = "missing", "Missing"
        ERROR = "error", "Error"

    host = models.ForeignKey(GpuHost, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    model_name = models.CharField(max_length=64, help_text="Catalog model, e.g. H200-SXM5-141GB.")
    product_name = models.CharField(max_length=100, blank=True)
    memory_mib = models.PositiveIntegerField()
    mig_capable = models.BooleanField(default=False)
    mig_enabled = models.BooleanField(default=False)
    mig_pending = models.BooleanField(default=False, help_text="MIG mode after the next GPU reset.")
    sharing = models.CharField(max_length=10, choices=Sharing.choices, default=Sharing.WHOLE)
    share_limit = models.PositiveSmallIntegerField(default=4, help_text="Sessions at once when time-sliced.")
    mig_policy = models.CharField(max_length=10, choices=Policy.choices, default=Policy.DYNAMIC)
    state = models.CharField(max_length=10, choices=State.choices, default=State.OK)
    state_detail = models.TextField(blank=True)
    # Bookkeeping, always updated with the slices and instances it summarises.
    memory_mask = models.PositiveIntegerField(default=0)
    compute_used = models.PositiveSmallIntegerField(default=0)
    profile_counts = models.JSONField(default=dict)
    layout_key = models.CharField(max_length=200, default="0:0:", help_text="The three fields above as one text.")
    active_slices = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["host__name", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_index_per_host")]
        # No index holds the layout columns (memory_mask ... active_slices): the allocator rewrites them on
        # every claim and release, and with none indexed those are HOT updates (migration 0002 keeps room for them).

    def __str__(self) -> str:
        return f"{self.host.name} GPU {self.index} ({self.model_name})"

    @property
    def catalog_model(self) -> catalog.GpuModel:
        return catalog.model(self.model_name)

    @property
    def simulated(self) -> bool:
        return self.host.simulated

    @property
    def memory_gib(self) -> float:
        return round(self.memory_mib / 1024, 1)

    def layout(self) -> Layout:
        return Layout(self.memory_mask, self.compute_used, tuple(sorted(self.profile_counts.items())))

    def set_layout(self, layout: Layout) -> None:
        self.memory_mask = layout.memory_mask
        self.compute_used = layout.compute_used
        self.profile_counts = dict(layout.counts)
        self.layout_key = layout.key


class GpuInstance(models.Model):
    """A MIG GPU instance (with its compute instance) that exists on a GPU."""

    class Origin(models.TextChoices):
        LAYOUT = "layout", "Static layout"
        DYNAMIC = "dynamic", "Created for one slice"

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="instances")
    profile = models.CharField(max_length=32)
    start = models.PositiveSmallIntegerField()
    size = models.PositiveSmallIntegerField()
    gi_id = models.PositiveIntegerField()
    ci_id = models.PositiveIntegerField(default=0)
    device_uuid = models.CharField(max_length=64, unique=True)
    origin = models.CharField(max_length=10, choices=Origin.choices)

    class Meta:
        ordering = ["gpu", "start"]
        constraints = [models.UniqueConstraint(fields=["gpu", "start"], name="instance_unique_start_per_gpu")]

    def __str__(self) -> str:
        return f"{self.profile}@{self.start} on {self.gpu}"

    @classmethod
    def of(cls, gpu_id: int, found: FoundInstance, origin: str) -> GpuInstance:
        """The row (not yet saved) for an instance the backend created or found on a GPU."""
        return cls(
            gpu_id=gpu_id,
            profile=found.profile,
            start=found.start,
            size=found.size,
            gi_id=found.gi_id,
            ci_id=found.ci_id,
            device_uuid=found.device_uuid,
            origin=origin,
        )

    @classmethod
    def record(cls, gpu: Gpu, found: FoundInstance, origin: str) -> GpuInstance:
        """Record an instance the backend created or found on ``gpu``."""
        instance = cls.of(gpu.pk, found, origin)
        instance.gpu = gpu
        instance.save(force_insert=True)
        return instance


class Slice(models.Model):
    class Kind(models.TextChoices):
        MIG = "mig", "MIG slice"
        WHOLE = "whole", "Whole GPU"
        SHARED = "shared", "Time-sliced share"

    class Market(models.TextChoices):
        """How it is sold: on-demand, or spot (cheaper, and reclaimed when an on-demand request needs the room)."""

        ON_DEMAND = "on_demand", "On-demand"
        SPOT = "spot", "Spot"

    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="slices")
    instance = models.ForeignKey(GpuInstance, on_delete=models.SET_NULL, null=True, blank=True, related_name="slices")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    profile = models.CharField(max_length=32, blank=True)
    placement_start = models.PositiveSmallIntegerField(null=True, blank=True)
    placement_size = models.PositiveSmallIntegerField(null=True, blank=True)
    compute_slices = models.PositiveSmallIntegerField(default=0)
    memory_gib = models.FloatField(default=0)
    shares = models.PositiveSmallIntegerField(
        default=1, db_default=1, help_text="N of a time-sliced GPU, frozen at allocation (each share pays 1/N); else 1."
    )
    device_uuid = models.CharField(max_length=64, help_text="What the container receives as NVIDIA_VISIBLE_DEVICES.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="slices")
    holder_kind = models.CharField(max_length=16, choices=HolderKind.choices, blank=True)
    holder_id = models.PositiveBigIntegerField(null=True, blank=True, help_text="The session's or render job's id.")
    held_from = models.DateTimeField(
        null=True, blank=True, help_text="When its holder began running on it: its container's start, from Docker."
    )
    held_until = models.DateTimeField(
        null=True, blank=True, help_text="When its holder stopped running on it: the moment its container was gone."
    )
    seen_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The last proof of life of its holder's container (the database's clock): the engine or the "
        "worker following it saw it running then. An open holding is charged only up to this moment.",
    )
    allocated_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=100, blank=True)
    market = models.CharField(max_length=10, choices=Market.choices, default=Market.ON_DEMAND, db_default="on_demand")
    metered = models.BooleanField(
        default=False, db_default=False, help_text="Billing has opened the usage of its holding (billing/meter.py)."
    )

    class Meta:
        ordering = ["-allocated_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["instance"], condition=Q(released_at__isnull=True), name="slice_one_active_per_instance"
            ),
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(released_at__isnull=True, kind="whole"),
                name="slice_one_active_whole_per_gpu",
            ),
            models.CheckConstraint(
                condition=Q(holder_kind="", holder_id__isnull=True) | (~Q(holder_kind="") & Q(holder_id__isnull=False)),
                name="slice_holder_kind_with_id",
            ),
            models.CheckConstraint(
                condition=Q(held_until__isnull=True) | Q(held_from__isnull=False, held_until__gte=F("held_from")),
                name="slice_held_until_after_from",
            ),
        ]
        indexes = [
            models.Index(fields=["owner", "released_at"]),
            # The slices a person holds now, counted at every launch against their limit. Only held slices
            # are in it, and PostgreSQL reads it without a bitmap, so an entry a release left behind is
            # marked dead the first time it is met: a person's thousandth launch counts as fast as their
            # first, between vacuums too (the index above left every released slice to the heap, 0.4-1 ms).
            models.Index(fields=["owner"], condition=Q(released_at__isnull=True), name="slice_held_by_owner_idx"),
            models.Index(fields=["holder_kind", "holder_id"], name="slice_holder_idx"),
            # What people asked for lately (demand.py): a look at the window's slices, not the whole table.
            models.Index(fields=["kind", "allocated_at"], name="slice_recent_idx"),
            # The meter's look for holdings it has not opened yet: a few rows, however long the history.
            models.Index(
                fields=["id"], condition=Q(held_from__isnull=False, metered=False), name="slice_unmetered_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.describe()} for {self.owner}"

    @property
    def active(self) -> bool:
        return self.released_at is None

    @property
    def holder(self) -> Holder | None:
        if not self.holder_kind or self.holder_id is None:
            return None
        return Holder(HolderKind(self.holder_kind), self.holder_id)

    def describe(self) -> str:
        if self.kind == self.Kind.MIG:
            return f"{self.profile} at memory slice {self.placement_start} of {self.gpu}"
        return f"{self.get_kind_display()} on {self.gpu}"


_PENDING_RECLAIM = Q(state="pending")


class Reclaim(models.Model):
    """A spot slice promised to a holder an on-demand request found no room for.

    The spot holder is told and, after PORTAL_SPOT_GRACE_SECONDS, stopped; when it is gone the waiting
    holder is given the room in the same transaction as the release (sessions/notebooks/spot.py). The
    request it waits with is kept here, so the hand-over asks for exactly what was refused.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Waiting for the spot slice"
        HANDED_OVER = "handed_over", "Handed over"
        CANCELLED = "cancelled", "Cancelled"

    slice = models.ForeignKey(Slice, on_delete=models.PROTECT, related_name="reclaims")
    waiting_kind = models.CharField(max_length=16, choices=HolderKind.choices)
    waiting_id = models.PositiveBigIntegerField(help_text="The waiting session's or render job's id.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reclaims")
    request_kind = models.CharField(max_length=10, choices=Slice.Kind.choices)
    request_profile = models.CharField(max_length=32, blank=True)
    request_model = models.CharField(max_length=64, blank=True)
    request_host = models.CharField(max_length=100, blank=True)
    noticed_at = models.DateTimeField(help_text="When the spot holder's owner was told.")
    due_at = models.DateTimeField(help_text="When the spot holder is stopped: the notice plus the grace time.")
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING)
    settled_at = models.DateTimeField(null=True, blank=True, help_text="When it was handed over or cancelled.")

    class Meta:
        ordering = ["-noticed_at"]
        constraints = [
            models.UniqueConstraint(fields=["slice"], condition=_PENDING_RECLAIM, name="reclaim_one_pending_per_slice"),
            models.UniqueConstraint(
                fields=["waiting_kind", "waiting_id"], condition=_PENDING_RECLAIM, name="reclaim_one_pending_per_waiter"
            ),
        ]
        indexes = [models.Index(fields=["due_at"], condition=_PENDING_RECLAIM, name="reclaim_pending_due_idx")]

    def __str__(self) -> str:
        return f"slice {self.slice_id} for {self.waiting}: {self.state}"

    @property
    def waiting(self) -> Holder:
        return Holder(HolderKind(self.waiting_kind), self.waiting_id)


class HostOrder(models.Model):
    """A change to a host's GPUs that only its agent carries out (``sessions.gpus.orders``).

    Recorded in the transaction that decides it (an allocation's, a release's, an operator's layout), so it
    exists exactly when that decision does; the host's agent claims it (``FOR UPDATE SKIP LOCKED``), carries it
    out and records the result in one transaction, so a crash before that leaves it pending for the next try,
    which finds what the first made and adopts it (the placement is its idempotency key on the device). One
    GPU's orders run in the order they were recorded: a destroy always before the create that reuses its room.
    """

    class Action(models.TextChoices):
        CREATE = "create", "Create a MIG instance"
        DESTROY = "destroy", "Destroy a MIG instance"
        LAYOUT = "layout", "Apply a static layout"

    class State(models.TextChoices):
        PENDING = "pending", "Waiting for the host's agent"
        DONE = "done", "Done"
        FAILED = "failed", "Refused by the device"
        CANCELLED = "cancelled", "Given up before the agent took it"

    key = models.UUIDField(default=uuid.uuid4, unique=True, help_text="Names the order once, whoever retries it.")
    host = models.ForeignKey(GpuHost, on_delete=models.CASCADE, related_name="orders")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="orders")
    action = models.CharField(max_length=10, choices=Action.choices)
    slice = models.ForeignKey(Slice, on_delete=models.SET_NULL, null=True, blank=True, related_name="orders")
    profile = models.CharField(max_length=32, blank=True)
    start = models.PositiveSmallIntegerField(null=True, blank=True)
    layout = models.JSONField(default=list, blank=True, help_text="A layout order's [profile, start] pairs.")
    undoes = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, help_text="The create order a destroy undoes."
    )
    gi_id = models.PositiveIntegerField(null=True, blank=True, help_text="The GPU instance made or to destroy.")
    device_uuid = models.CharField(max_length=64, blank=True, help_text="The MIG device a create made.")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # What an agent looks for: its hosts' pending orders, a handful however long the history.
            models.Index(fields=["host", "id"], condition=Q(state="pending"), name="hostorder_pending_idx"),
            # Whether an order has an earlier one of its GPU still pending (asked of every order an agent takes).
            models.Index(fields=["gpu", "id"], condition=Q(state="pending"), name="hostorder_pending_gpu_idx"),
            models.Index(fields=["slice"], name="hostorder_slice_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.action} on {self.gpu_id} ({self.state})"


class SliceQuota(models.Model):
    """A per-user limit on concurrent slices, overriding PORTAL_MAX_SLICES_PER_USER."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slice_quota")
    max_slices = models.PositiveSmallIntegerField()

    def __str__(self) -> str:
        return f"{self.user}: at most {self.max_slices} slices"


class SimulatedGpuInstance(models.Model):
    """The simulated backend's stand-in for driver state: MIG instances that 'exist' on a simulated GPU."""

    gpu_uuid = models.CharField(max_length=64)
    gi_id = models.PositiveIntegerField()
    profile = models.CharField(max_length=32)
    start = models.PositiveSmallIntegerField()
    size = models.PositiveSmallIntegerField()
    device_uuid = models.CharField(max_length=64, unique=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["gpu_uuid", "gi_id"], name="simulated_unique_gi"),
            models.UniqueConstraint(fields=["gpu_uuid", "start"], name="simulated_unique_start"),
        ]

    def __str__(self) -> str:
        return f"simulated {self.profile}@{self.start} on {self.gpu_uuid}"
