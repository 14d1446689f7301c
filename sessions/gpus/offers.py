"""What a person can launch on right now: one offer per MIG profile, whole GPU or share, per model."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from django.contrib.auth.models import User

from sessions.gpus import catalog, pricing
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.capacity import capacities
from sessions.gpus.models import Gpu
from sessions.gpus.pricing import OfferPrice


@dataclass(frozen=True)
class Offer:
    key: str
    label: str
    request: SliceRequest
    memory_gib: float
    free: int
    isolated: bool
    simulated: bool
    price: OfferPrice | None = None  # from whoever bills launches (sessions/gpus/pricing.py)

    @property
    def price_per_hour(self) -> str:
        return self.price.per_hour if self.price else "—"


def offers(owner: User | None = None) -> list[Offer]:
    """What can be launched now; priced for ``owner`` (their balance, how long it lasts) when given."""
    found = _available()
    if owner is None:
        return found
    priced = pricing.current().prices(owner, [offer.request for offer in found])
    return [replace(offer, price=priced.get(offer.request)) for offer in found]


def _available() -> list[Offer]:
    free: dict[tuple[str, str, str], int] = defaultdict(int)
    simulated: dict[str, bool] = {}
    gpus = list(Gpu.objects.filter(state=Gpu.State.OK).select_related("host"))
    mig = [gpu for gpu in gpus if gpu.sharing == Gpu.Sharing.MIG]
    for gpu, counts in zip(mig, capacities(mig), strict=True):
        for profile, count in counts.items():
            free[("mig", gpu.model_name, profile)] += count
    for gpu in gpus:
        simulated[gpu.model_name] = simulated.get(gpu.model_name, True) and gpu.simulated
        if gpu.sharing == Gpu.Sharing.WHOLE:
            free[("whole", gpu.model_name, "")] += int(gpu.active_slices == 0)
        elif gpu.sharing == Gpu.Sharing.SHARED:
            free[("shared", gpu.model_name, "")] += max(0, gpu.share_limit - gpu.active_slices)
    return sorted(
        (_offer(kind, model, profile, count, simulated[model]) for (kind, model, profile), count in free.items()),
        key=lambda offer: (offer.request.model, offer.request.kind != "mig", offer.memory_gib, offer.key),
    )


def _offer(kind: str, model_name: str, profile: str, count: int, simulated: bool) -> Offer:
    model = catalog.model(model_name)
    if kind == "mig":
        memory = model.profile(profile).memory_gib
        label = f"{model_name} · MIG {profile} ({memory:g} GiB)"
    elif kind == "whole":
        memory, label = model.memory_gib, f"{model_name} · whole GPU ({model.memory_gib:g} GiB)"
    else:
        memory = model.memory_gib
        label = f"{model_name} · time-sliced share (no memory isolation)"
    return Offer(
        key=f"{kind}:{model_name}:{profile}",
        label=label,
        request=SliceRequest(kind=kind, profile=profile, model=model_name),
        memory_gib=memory,
        free=count,
        isolated=kind != "shared",
        simulated=simulated,
    )


def request_for(key: str) -> SliceRequest | None:
    """Turn an offer key from a form back into a request; None if it is not a well-formed key."""
    kind, _, rest = key.partition(":")
    model, _, profile = rest.partition(":")
    if kind not in {"mig", "whole", "shared"} or model not in catalog.models() or (kind == "mig") != bool(profile):
        return None
    return SliceRequest(kind=kind, profile=profile, model=model)


def offer_choice_label(offer: Offer) -> str:
    """An offer as a choice on a form: what it is, how many are free, its prices."""
    price = f" — {offer.price_per_hour}/h" if offer.price else ""
    if offer.price and offer.price.spot_per_hour:
        price += f", spot {offer.price.spot_per_hour}/h"
    return f"{offer.label} — {offer.free} free{price}{' (simulated)' if offer.simulated else ''}"
