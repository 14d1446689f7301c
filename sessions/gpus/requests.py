"""What someone asks the allocator for, and the checks every request passes before any pool is touched: a
request names what exists, the working GPUs it may go on (hosts that are up), and the words a refusal says."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils import timezone

from sessions.gpus import catalog
from sessions.gpus.catalog import GpuModel
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, GpuHost, Slice


@dataclass(frozen=True)
class SliceRequest:
    """What someone asks for: a MIG profile, a whole GPU or a time-sliced share, optionally on a model or host,
    on-demand or spot (``Slice.Market``).

    ``model`` takes a catalog name or its short form (``H200``), as the fleet setting does.
    """

    kind: str
    profile: str = ""
    model: str = ""
    host: str = ""
    market: str = Slice.Market.ON_DEMAND


class AllocationRefused(Exception):
    """No slice was given; ``reason`` says why in words a user can act on."""

    def __init__(self, reason: str, code: str = "no_capacity", free: dict[str, int] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.code, self.free = reason, code, free or {}


class ReleaseRefused(Exception):
    pass


def checked(request: SliceRequest) -> SliceRequest:
    """The request with its model's full name; refused at once if it names what does not exist."""
    if request.kind not in Slice.Kind.values:
        raise AllocationRefused(f"Unknown kind of slice {request.kind!r}.", code="bad_request")
    if request.market not in Slice.Market.values:
        raise AllocationRefused(f"Unknown market {request.market!r}; on_demand or spot.", code="bad_request")
    model = catalog.resolve(request.model) if request.model else ""
    if request.model and model not in catalog.models():
        known = ", ".join(sorted(catalog.ALIASES))
        raise AllocationRefused(f"There is no GPU model {request.model!r}; try one of {known}.", code="unknown_model")
    if request.host and not GpuHost.objects.filter(name=request.host).exists():
        raise AllocationRefused(f"There is no GPU host named {request.host!r}.", code="unknown_host")
    return replace(request, model=model)


def models_for(request: SliceRequest) -> tuple[GpuModel, ...]:
    """The catalog models that have the requested profile, in the order they are tried."""
    return models_with(request.model, request.profile)


@cache
def models_with(model_name: str, profile: str) -> tuple[GpuModel, ...]:
    names = [model_name] if model_name else sorted(catalog.models())  # the catalog never changes in a process
    return tuple(
        model
        for name in names
        if (model := catalog.models().get(name)) and any(p.name == profile for p in model.profiles)
    )


def gpus_for(request: SliceRequest, sharing: str, any_host: bool = False) -> QuerySet[Gpu]:
    """Working GPUs handed out as ``sharing`` on hosts that are up (sessions.gpus.hosts; ``any_host``: on any
    host), as asked."""
    gpus = Gpu.objects.filter(sharing=sharing, state=Gpu.State.OK)
    if not any_host:
        gpus = gpus.filter(host__state=GpuHost.State.UP)
    if request.model:
        gpus = gpus.filter(model_name=request.model)
    if request.host:
        gpus = gpus.filter(host__name=request.host)
    return gpus


def refuse_if_hosts_away(gpus: QuerySet[Gpu], what: str) -> None:
    """Refuse, saying so, when every host with such GPUs is draining or lost."""
    if not gpus.filter(host__state=GpuHost.State.UP).exists():
        states = sorted(set(gpus.values_list("host__state", flat=True)))
        raise AllocationRefused(
            f"Every GPU host with {what} is {' or '.join(states)} and takes no new work now; try again later.",
            code="hosts_away",
        )


def no_capacity_message(profile: str, free: dict[str, int]) -> str:
    """What else is free, never the refused profile itself (which a look just found had no room)."""
    others = sorted((name, count) for name, count in free.items() if count and not name.endswith(f" {profile}"))
    available = [f"{name} ×{count}" for name, count in others]
    tail = "Free right now: " + ", ".join(available) + "." if available else "Nothing else is free right now."
    return f"No {profile} slice is free now. {tail}"


def new_slice(
    owner: User,
    request: SliceRequest,
    gpu_id: int,
    holder: Holder | None,
    device_uuid: str,
    compute_slices: int,
    memory_gib: float,
) -> Slice:
    return Slice(
        gpu_id=gpu_id,
        kind=request.kind,
        market=request.market,
        holder_kind=holder.kind if holder else "",
        holder_id=holder.id if holder else None,
        compute_slices=compute_slices,
        memory_gib=memory_gib,
        device_uuid=device_uuid,
        owner=owner,
        allocated_at=timezone.now(),
    )
