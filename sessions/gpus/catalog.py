"""The facts about GPU models and their MIG profiles, loaded once from data/.

A profile occupies ``placement_size`` memory slices starting at one of its
``placements`` and needs ``compute_slices`` of the GPU's compute slices; a GPU
holds at most ``max_count`` instances of it. The driver is the authority on a
real GPU; these tables are what the simulated backend and the allocator obey.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


class UnknownModel(ValueError):
    pass


class UnknownProfile(ValueError):
    pass


@dataclass(frozen=True)
class Profile:
    name: str
    compute_slices: int
    memory_slices: int
    memory_gib: float
    max_count: int
    placements: tuple[int, ...]
    placement_size: int
    smi_profile_id: int
    sm_count: int

    def __hash__(self) -> int:
        return hash((self.name, self.placement_size, self.compute_slices))

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")

    def mask_at(self, start: int) -> int:
        """Bit mask of the memory slices this profile covers when placed at ``start``."""
        return ((1 << self.placement_size) - 1) << start


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gib: float
    mig_capable: bool
    memory_slices: int = 0
    compute_slices: int = 0
    profiles: tuple[Profile, ...] = ()

    def __hash__(self) -> int:
        # Placement caches key on the model: its name is enough, and far cheaper than every profile.
        return hash(self.name)

    def profile(self, name: str) -> Profile:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        known = ", ".join(p.name for p in self.profiles) or "none (this model has no MIG)"
        raise UnknownProfile(f"{self.name} has no MIG profile {name!r}; its profiles: {known}.")

    def profile_by_shape(self, compute_slices: int, memory_slices: int) -> Profile | None:
        for profile in self.profiles:
            shape = (profile.compute_slices, profile.memory_slices)
            if shape == (compute_slices, memory_slices) and not profile.media_extensions:
                return profile
        return None

    @property
    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1


def _profile(raw: dict[str, object]) -> Profile:
    return Profile(
        name=str(raw["profile"]),
        compute_slices=int(raw["compute_slices"]),  # type: ignore[call-overload]
        memory_slices=int(raw["memory_slices"]),  # type: ignore[call-overload]
        memory_gib=float(raw["memory_gib"]),  # type: ignore[arg-type]
        max_count=int(raw["max_count"]),  # type: ignore[call-overload]
        placements=tuple(int(p) for p in raw["placements"]),  # type: ignore[attr-defined]
        placement_size=int(raw["placement_size"]),  # type: ignore[call-overload]
        smi_profile_id=int(raw["smi_profile_id"]),  # type: ignore[call-overload]
        sm_count=int(raw["sm_count"]),  # type: ignore[call-overload]
    )


# Short names people and the fleet setting use for catalog models.
ALIASES = {
    "H200": "H200-SXM5-141GB",
    "H100": "H100-SXM5-80GB",
    "A100-80GB": "A100-SXM4-80GB",
    "A100-40GB": "A100-SXM4-40GB",
    "A100": "A100-SXM4-80GB",
    "A30": "A30-24GB",
    "L4": "L4-24GB",
    "L40S": "L40S-48GB",
    "T4": "T4-16GB",
}


def resolve(name: str) -> str:
    """A catalog model's full name from its short one (``H200``); other names are returned as they are."""
    return ALIASES.get(name, name)


@cache
def models() -> dict[str, GpuModel]:
    whole = json.loads((DATA / "gpu_models.json").read_text())["models"]
    mig = json.loads((DATA / "mig_profiles.json").read_text())["models"]
    result: dict[str, GpuModel] = {}
    for name, facts in whole.items():
        raw_profiles = mig.get(name, [])
        profiles = tuple(_profile(raw) for raw in raw_profiles)
        result[name] = GpuModel(
            name=name,
            memory_gib=float(facts["memory_gib"]),
            mig_capable=bool(facts["mig"]),
            memory_slices=int(raw_profiles[0]["total_memory_slices"]) if raw_profiles else 0,
            compute_slices=int(raw_profiles[0]["total_compute_slices"]) if raw_profiles else 0,
            profiles=profiles,
        )
    return result


def model(name: str) -> GpuModel:
    try:
        return models()[name]
    except KeyError:
        raise UnknownModel(f"Unknown GPU model {name!r}; known models: {', '.join(models())}.") from None


def model_for_product_name(product: str, memory_mib: int) -> GpuModel | None:
    """Match what NVML reports (e.g. 'NVIDIA H200', 143771 MiB) to a catalog model."""
    # NVML says e.g. 'NVIDIA H200', 'NVIDIA A100-SXM4-80GB' or 'Tesla T4'.
    words = product.upper().replace("NVIDIA", "").replace("TESLA", "").replace("-", " ").split()
    if not words:
        return None
    family = words[0]
    candidates = [m for m in models().values() if m.name.split("-")[0].upper() == family]
    if not candidates:
        return None
    return min(candidates, key=lambda m: abs(m.memory_gib * 1024 - memory_mib))
