"""How much more fits, for pages and refusals: per MIG GPU (a dynamic GPU's from its layout, a static one's from
its free instances) and summed over the fleet's GPUs on hosts that take new work. Read-only."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Count

from sessions.gpus import placement
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, Slice


def free_capacity(model_name: str | None = None) -> dict[str, int]:
    """How many more of each 'model profile' fit right now, summed over GPUs (each counted alone)."""
    free: dict[str, int] = {}
    gpus = Gpu.objects.filter(sharing=Gpu.Sharing.MIG, state=Gpu.State.OK, host__state=GpuHost.State.UP)
    if model_name:
        gpus = gpus.filter(model_name=model_name)
    found = list(gpus)
    for gpu, counts in zip(found, capacities(found), strict=True):
        for profile, count in counts.items():
            key = f"{gpu.model_name} {profile}"
            free[key] = free.get(key, 0) + count
    return free


def gpu_capacity(gpu: Gpu) -> dict[str, int]:
    return capacities([gpu])[0]


def capacities(gpus: Sequence[Gpu]) -> list[dict[str, int]]:
    """How many more of each profile fit on each MIG GPU: a dynamic GPU's from its layout, a static one's from
    its free instances, those of every static GPU in one query (the launch form lists the whole fleet)."""
    static = [gpu.pk for gpu in gpus if gpu.mig_policy == Gpu.Policy.STATIC]
    free: dict[int, dict[str, int]] = {pk: {} for pk in static}
    if static:
        # Whole-GPU and shared slices have no instance; a NULL in NOT IN would hide every instance.
        busy = Slice.objects.filter(released_at__isnull=True, instance__isnull=False).values("instance_id")
        idle = GpuInstance.objects.filter(gpu_id__in=static).exclude(pk__in=busy)
        for gpu_id, profile, count in idle.values_list("gpu_id", "profile").annotate(n=Count("id")).order_by():
            free[gpu_id][profile] = count
    return [_capacity(gpu, free.get(gpu.pk, {})) for gpu in gpus]


def _capacity(gpu: Gpu, free_instances: dict[str, int]) -> dict[str, int]:
    model = gpu.catalog_model
    if gpu.mig_policy == Gpu.Policy.DYNAMIC:
        return placement.capacity(model, gpu.layout())
    return {profile.name: free_instances.get(profile.name, 0) for profile in model.profiles}
