"""An independent check of the fleet's slices against NVIDIA's placement tables.

Written apart from the allocator and its placement module: it reads the
profile table straight from the JSON file and the slices straight from the
database, and says what is wrong, if anything.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from sessions.gpus.models import Gpu, Slice

TABLE = Path(__file__).resolve().parents[2] / "sessions/gpus/data/mig_profiles.json"


def profile_table() -> dict[str, dict[str, dict[str, object]]]:
    models = json.loads(TABLE.read_text())["models"]
    return {model: {row["profile"]: row for row in rows} for model, rows in models.items()}


def problems() -> list[str]:
    table = profile_table()
    found: list[str] = []
    active = Slice.objects.filter(released_at__isnull=True).select_related("gpu")
    by_gpu: dict[int, list[Slice]] = defaultdict(list)
    for taken in active:
        by_gpu[taken.gpu_id].append(taken)
    for gpu_id, slices in by_gpu.items():
        gpu = Gpu.objects.get(pk=gpu_id)
        if gpu.sharing == "mig":
            found += _mig_problems(gpu, slices, table[gpu.model_name])
        elif gpu.sharing == "whole" and len(slices) > 1:
            found.append(f"{gpu.uuid}: {len(slices)} slices on a whole GPU")
        elif gpu.sharing == "shared" and len(slices) > gpu.share_limit:
            found.append(f"{gpu.uuid}: {len(slices)} shares, limit {gpu.share_limit}")
    return found


def _mig_problems(gpu: Gpu, slices: list[Slice], profiles: dict[str, dict[str, object]]) -> list[str]:
    found = []
    taken_cells: set[int] = set()
    compute = 0
    for taken in slices:
        row = profiles.get(taken.profile)
        if row is None:
            found.append(f"{gpu.uuid}: unknown profile {taken.profile}")
            continue
        if taken.placement_start not in row["placements"]:  # type: ignore[operator]
            found.append(f"{gpu.uuid}: {taken.profile} at illegal start {taken.placement_start}")
        cells = set(range(taken.placement_start or 0, (taken.placement_start or 0) + int(row["placement_size"])))  # type: ignore[call-overload]
        if cells & taken_cells:
            found.append(f"{gpu.uuid}: {taken.profile}@{taken.placement_start} overlaps another slice")
        if max(cells) >= int(row["total_memory_slices"]):  # type: ignore[call-overload]
            found.append(f"{gpu.uuid}: {taken.profile}@{taken.placement_start} runs past the last memory slice")
        taken_cells |= cells
        compute += int(row["compute_slices"])  # type: ignore[call-overload]
        if taken.device_uuid[:4] != "MIG-":
            found.append(f"{gpu.uuid}: MIG slice with device {taken.device_uuid}")
    total = int(next(iter(profiles.values()))["total_compute_slices"])  # type: ignore[call-overload]
    if compute > total:
        found.append(f"{gpu.uuid}: {compute} compute slices in use of {total}")
    for profile, count in Counter(s.profile for s in slices).items():
        if profile in profiles and count > int(profiles[profile]["max_count"]):  # type: ignore[call-overload]
            found.append(f"{gpu.uuid}: {count} x {profile}, max {profiles[profile]['max_count']}")
    if len({s.device_uuid for s in slices}) != len(slices):
        found.append(f"{gpu.uuid}: two active slices share a device UUID")
    return found
