"""Which host a slice goes to when GPUs of several hosts would serve it equally (issue 32, item 4).

PORTAL_PLACEMENT says: ``pack`` (the default) puts it on the host that holds the most slices already, so whole
hosts stay free, for whole-GPU requests and for draining; ``spread`` on the host that holds the fewest, so one
host's loss ends as little as possible. A host's load is the slices its GPUs hold (every kind). Ties go to the
lowest GPU id. The choice among a host's GPUs is the allocator's own (the MIG layout's value, a whole GPU's
index, a shared GPU's fewest sessions); this only orders the hosts. The loads are read with the candidates, in
the same statement (the allocator's first look, ``sessions.gpus.whole``), and only on a fleet of several hosts.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings

PACK, SPREAD = "pack", "spread"


def busiest_first() -> bool:
    """Whether the host to fill first is the one that holds the most slices (pack) or the fewest (spread)."""
    return bool(settings.PLACEMENT != SPREAD)


def first_by_host(candidates: list[tuple[int, int]], load: Mapping[int, int]) -> int:
    """Of (GPU id, host id) pairs equally good to the allocator, the GPU on the host to fill first."""
    sign = -1 if busiest_first() else 1
    return min(candidates, key=lambda pair: (sign * load.get(pair[1], 0), pair[0]))[0]
