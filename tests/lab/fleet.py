"""The lab's simulated GPUs: different models and modes on each host, and the device UUIDs each host's NVIDIA
stand-in knows (its GPUs', and every MIG device its GPUs could be given)."""

from __future__ import annotations

from sessions.gpus.backends.simulated import parse_fleet


def fleet_spec(lab: str) -> str:
    """PORTAL_SIMULATED_FLEET for a lab named ``lab``: host names are the lab's node names. Two hosts have an L4
    each, so one job's slices can be on two hosts at once."""
    return f"{lab}-n1: 1xH200:mig; {lab}-n2: 1xA100-80GB:mig, 1xL4:whole; {lab}-n3: 2xA30:shared=2, 1xL4:whole"


def devices(spec: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for gpu in parse_fleet(spec):
        found.setdefault(gpu.host, set()).update(gpu.device_uuids())
    return found
