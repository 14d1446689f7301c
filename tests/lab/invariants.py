"""What must hold after anything the lab does to the portal (issue 32, item 5), checked after each lab test:

- no slice held twice: no two unreleased slices on one device (a time-shared GPU's shares apart) and no
  more sessions on a shared GPU than its share limit;
- no slice of a lost host handed out after the host was lost;
- the ledger balanced, every transaction on its own;
- every holding that ended settled to its end: charged (a usage opened for it), and its usage closed;
- no container without a row, nor a row without a container: each container of this run's portal on a lab
  engine belongs to an unreleased slice, and (``running``) each slice said to run has its container.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable

from django.conf import settings
from django.db.models import Count

from billing import meter
from billing.models import Usage
from sessions.gpus.models import Gpu, GpuHost, Slice
from sessions.runtime.spec import INSTANCE_LABEL, LABEL_PREFIX
from tests.billing.conftest import ledger_total, unbalanced_transactions
from tests.helpers.waiting import wait_for
from tests.lab.lab import Lab


def containers_of_this_portal(lab: Lab) -> dict[str, list[dict[str, str]]]:
    """Each lab host's containers (running or not) that this run's portal started: their labels."""
    found: dict[str, list[dict[str, str]]] = {}
    for node in lab.nodes:
        listed = node.docker("ps", "-aq", "--filter", f"label={INSTANCE_LABEL}={settings.INSTANCE_ID}", check=False)
        ids = listed.split()
        # One removed between the listing and this look (a stopped session's, on its way out) is gone: inspect
        # answers for the others and names it on stderr.
        inspected = json.loads(node.docker("inspect", *ids, check=False) or "[]") if ids else []
        found[node.name] = [container["Config"]["Labels"] for container in inspected]
    return found


def check(lab: Lab, running: Iterable[int] = (), settle_within: float = 60) -> None:
    """The invariants, once the meter has charged what ended (waited for up to ``settle_within`` s: the
    worker's end-of-holding charge may still be on its way). ``running``: slices whose containers must run."""
    held = Slice.objects.filter(released_at__isnull=True)
    doubled = held.exclude(kind=Slice.Kind.SHARED).values("device_uuid").annotate(n=Count("id")).filter(n__gt=1)
    assert not list(doubled), f"slices held twice: {list(doubled)}"
    shares = held.filter(kind=Slice.Kind.SHARED).values("gpu").annotate(taken=Count("id"))
    for row in shares:
        gpu = Gpu.objects.get(pk=row["gpu"])
        assert row["taken"] <= gpu.share_limit, f"{gpu.uuid} has {row['taken']} shares taken of {gpu.share_limit}"
    for host in GpuHost.objects.filter(state=GpuHost.State.LOST, state_since__isnull=False):
        late = held.filter(gpu__host=host, allocated_at__gt=host.state_since)
        assert not late.exists(), f"slices of lost host {host.name} handed out after it was lost: {list(late)}"

    ended = Slice.objects.filter(released_at__isnull=False, held_from__isnull=False)

    def settled() -> bool:
        meter.tick()
        closed = Usage.objects.filter(open=False, slice__in=ended).count()
        return closed == ended.count()

    wait_for(settled, settle_within, "every ended holding charged to its end")
    assert ledger_total() == 0 and unbalanced_transactions() == [], "the ledger is balanced"

    slices_with_containers: set[int] = set()

    def no_stray_container() -> bool:
        """Every container of this portal belongs to an unreleased slice. A stopped session's Swarm task is
        removed by its node some moments after its service (the node's own clean-up): it is given
        ``settle_within`` to go, and one still there then fails the check."""
        strays.clear()
        slices_with_containers.clear()
        for node_name, containers in containers_of_this_portal(lab).items():
            for labels in containers:
                slice_id = int(labels.get(f"{LABEL_PREFIX}.slice", "0"))
                slices_with_containers.add(slice_id)
                if not held.filter(pk=slice_id).exists():
                    strays.append(f"a container on {node_name} of slice {slice_id}, released")
        return not strays

    strays: list[str] = []
    if not no_stray_container():
        with contextlib.suppress(AssertionError):
            wait_for(no_stray_container, settle_within, "the released slices' containers removed by their nodes")
    assert not strays, strays
    missing = set(running) - slices_with_containers
    assert not missing, f"slices said to run without a container: {sorted(missing)}"
