"""The container spec of a slice, from the slice and the portal's settings: the one place it is built.

The Docker adapter applies it to batch containers; the internal API hands it to
the hub's spawner for notebooks (see ``sessions.runtime.spec``).
"""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings

from sessions.gpus.models import Slice
from sessions.runtime.spec import INSTANCE_LABEL, LABEL_PREFIX, NO_NETWORK, ContainerSpec, Limits, LogLimits, limits


def limits_for(taken: Slice, host_cpus: int | None = None) -> Limits:
    found = limits(
        taken.compute_slices,
        taken.memory_gib,
        settings.CPUS_PER_COMPUTE_SLICE,
        settings.HOST_MEMORY_PER_GPU_GIB,
        int(settings.CONTAINER_PIDS_LIMIT),
    )
    return found.at_most(host_cpus)


def labels_for(taken: Slice, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels naming the portal, the slice, its GPU and device, its owner and holder (reconciliation reads them)."""
    labels = {
        INSTANCE_LABEL: settings.INSTANCE_ID,
        f"{LABEL_PREFIX}.slice": str(taken.pk),
        f"{LABEL_PREFIX}.gpu": taken.gpu.uuid,
        f"{LABEL_PREFIX}.device": taken.device_uuid,
        f"{LABEL_PREFIX}.owner": str(taken.owner_id),
        f"{LABEL_PREFIX}.holder": str(taken.holder or ""),
    }
    return {**labels, **(extra or {})}


def spec_for(
    taken: Slice,
    image: str,
    network: str = NO_NETWORK,
    labels: Mapping[str, str] | None = None,
    host_cpus: int | None = None,
) -> ContainerSpec:
    """What a container on this slice runs with; batch work gets no network unless told otherwise."""
    return ContainerSpec(
        image=image,
        device_ids=(taken.device_uuid,),
        limits=limits_for(taken, host_cpus),
        labels=labels_for(taken, labels),
        network=network,
        logs=LogLimits(settings.CONTAINER_LOG_MAX_BYTES, settings.CONTAINER_LOG_FILES),
    )
