"""The allocator's in-memory view of the fleet's MIG layouts, kept current by re-reading what changed.

Choosing a placement needs the distinct layouts among a model's GPUs. Asking
PostgreSQL to group a thousand GPUs on every request costs more than the rest
of the decision, so each thread keeps the answer and, with each request,
re-reads only the GPU rows written since it last looked:

- a trigger stamps every inserted or updated GPU row with the writing
  transaction's id (``changed_xid``, migration 0003);
- each look also notes the oldest transaction still running at that moment
  (``pg_snapshot_xmin``). Every transaction older than that had finished, so
  its writes were in what was read; anything it missed carries a stamp at
  least that large and is read again next time.

The view only proposes: the claim re-checks the chosen GPU's layout under its
row lock, so a view that is out of date (a GPU deleted, say) can cost a retry,
never a wrong placement. A failed claim makes the next look a full one.
Used on PostgreSQL outside any enclosing transaction (``sql.manual()``);
elsewhere the allocator groups in SQL as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from django.db import connection

from sessions.gpus.catalog import GpuModel, Profile
from sessions.gpus.models import Gpu
from sessions.gpus.placement import Layout
from sessions.gpus.sql import Rows, Statement

T = TypeVar("T")
GPU = Gpu._meta.db_table
# One statement, so the oldest running transaction and the rows come from the same snapshot. The
# outer join yields one row (with NULL GPU columns) when nothing changed.
LOOK = (
    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, g.id, g.model_name, g.sharing, g.state,"
    f" g.mig_policy, g.layout_key FROM (SELECT 1) AS one LEFT JOIN {GPU} g ON g.changed_xid >= %s"
)


MEMO_SIZE = 512  # answers kept, over all questions and states


class FleetView:
    def __init__(self) -> None:
        self.since: int | None = None  # None: the next look reads every GPU
        self.gpus: dict[int, tuple[str, str, str]] = {}  # id -> (model, policy, layout key)
        self.groups: dict[str, dict[tuple[str, str], set[int]]] = {}  # model -> (policy, key) -> ids
        # A fingerprint of everything above (hashes of (id, model, policy, key), XOR-ed): it comes
        # back to the same value when a GPU goes back to a layout it had, as on every release.
        self.state = 0
        self._memo: dict[tuple[Hashable, int], Any] = {}

    def statement(self) -> Statement:
        """What to send with the request's first round trip: the oldest running transaction and what changed."""
        return (LOOK, [self.since or 0])

    def apply(self, rows: Rows) -> None:
        if self.since is None:
            self.gpus.clear()
            self.groups.clear()
            self.state = 0
        for _, gpu_id, model, sharing, state, policy, key in rows:
            placeable = sharing == Gpu.Sharing.MIG and state == Gpu.State.OK
            if gpu_id is not None:
                self.note(gpu_id, (model, policy, key) if placeable else None)
        self.since = int(rows[0][0])

    def note(self, gpu_id: int, entry: tuple[str, str, str] | None) -> None:
        """GPU ``gpu_id`` now has (model, policy, layout key), or is not placeable (None).

        Looks call this for every row they read; the allocator also calls it for
        its own committed changes, so its next decision need not wait for the
        next look to see them. Those rows are read again by that look and then
        found as already known.
        """
        if self.gpus.get(gpu_id) == entry:
            return
        self._drop(gpu_id)
        if entry is not None:
            self.gpus[gpu_id] = entry
            self.state ^= hash((gpu_id, *entry))
            model, policy, key = entry
            self.groups.setdefault(model, {}).setdefault((policy, key), set()).add(gpu_id)

    def _drop(self, gpu_id: int) -> None:
        old = self.gpus.pop(gpu_id, None)
        if old is None:
            return
        self.state ^= hash((gpu_id, *old))
        model, policy, key = old
        ids = self.groups[model][(policy, key)]
        ids.discard(gpu_id)
        if not ids:
            del self.groups[model][(policy, key)]

    def forget(self) -> None:
        """Read every GPU again on the next look, and answer every question afresh."""
        self.since = None
        self._memo.clear()

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, kept for this state of the fleet: the same question about the same fleet, the same answer."""
        asked = (key, self.state)
        if asked in self._memo:
            return cast(T, self._memo[asked])
        if len(self._memo) >= MEMO_SIZE:
            self._memo.clear()
        value = self._memo[asked] = compute()
        return value

    def layouts(self, model: GpuModel, profile: Profile) -> Rows:
        """The same rows as the allocator's grouping query: (policy, layout key, first GPU id), by that id."""
        return self.memo(("layouts", model.name, profile.name), lambda: self._layouts(model, profile))

    def _layouts(self, model: GpuModel, profile: Profile) -> Rows:
        room = model.compute_slices - profile.compute_slices
        rows = [
            (policy, key, min(ids))
            for (policy, key), ids in self.groups.get(model.name, {}).items()
            if policy == Gpu.Policy.STATIC or Layout.from_key(key).compute_used <= room
        ]
        rows.sort(key=lambda row: row[2])
        return rows


_local = threading.local()


def current() -> FleetView:
    """This thread's view of the database it is connected to."""
    views: dict[str, FleetView] = _local.__dict__.setdefault("views", {})
    name = str(connection.settings_dict["NAME"])
    if name not in views:
        views[name] = FleetView()
    return views[name]
