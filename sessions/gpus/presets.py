"""Named MIG layouts an operator can apply to a GPU in static mode.

The names follow NVIDIA mig-parted's config names (all-1g, all-balanced, ...);
each is built from the catalog for the GPU's own geometry.
"""

from __future__ import annotations

from sessions.gpus.catalog import GpuModel

# (compute slices, memory slices, start) per instance, for 8- and 4-memory-slice GPUs.
SHAPES: dict[int, dict[str, list[tuple[int, int, int]]]] = {
    8: {
        "all-1g": [(1, 1, start) for start in range(7)],
        "all-2g": [(2, 2, 0), (2, 2, 2), (2, 2, 4)],
        "all-3g": [(3, 4, 0), (3, 4, 4)],
        "all-7g": [(7, 8, 0)],
        "all-balanced": [(2, 2, 0), (1, 1, 2), (1, 1, 3), (3, 4, 4)],
    },
    4: {
        "all-1g": [(1, 1, start) for start in range(4)],
        "all-2g": [(2, 2, 0), (2, 2, 2)],
        "all-4g": [(4, 4, 0)],
        "all-balanced": [(2, 2, 0), (1, 1, 2), (1, 1, 3)],
    },
}


def presets(gpu_model: GpuModel) -> dict[str, list[tuple[str, int]]]:
    """Preset name -> [(profile name, start)] for this model; empty if it has no MIG."""
    result: dict[str, list[tuple[str, int]]] = {}
    for name, shapes in SHAPES.get(gpu_model.memory_slices, {}).items():
        layout = []
        for compute, memory, start in shapes:
            profile = gpu_model.profile_by_shape(compute, memory)
            if profile is None:
                break
            layout.append((profile.name, start))
        else:
            result[name] = layout
    return result


def parse_layout(text: str) -> list[tuple[str, int]]:
    """Parse '3g.71gb@4, 2g.35gb@0' into [(profile, start)]; ValueError says what is wrong."""
    layout = []
    for item in filter(None, (piece.strip() for piece in text.replace("\n", ",").split(","))):
        profile, at, start = item.partition("@")
        if not at or not start.strip().isdigit():
            raise ValueError(f"{item!r} is not PROFILE@START, e.g. 3g.71gb@4")
        layout.append((profile.strip(), int(start)))
    return layout
