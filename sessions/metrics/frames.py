"""What the agent publishes each tick: one fleet frame for staff, one frame per person for their slices.

A frame is plain JSON, serialised once by the agent and forwarded as text by
the consumers. Figures a device does not report are null, never 0.

Fleet frame::

    {"kind": "fleet", "agent": "sim-1", "t": 1764470000.25, "simulated": true,
     "gpus": [{"uuid": "GPU-...", "host": "sim-1", "index": 0, "model": "H200-SXM5-141GB",
               "util": null, "mem_used": 1024.0, "mem_total": 144384.0, "temp": 40.1, "power": 150.2,
               "sm_clock": 1980.0, "mem_clock": 3201.0, "ecc": 0, "procs": 1, "problem": "",
               "users": [{"user": "alice", "session": 12, "job": null, "holder": "notebook:12",
                          "label": "Notebook session #12"}],
               "devices": [{"uuid": "MIG-...", "gi": 1, "profile": "1g.18gb", "util": 55.0,
                            "mem_used": 900.0, "mem_total": 18432.0, "users": [...]}]}]}

Personal frame (only the person's own slices)::

    {"kind": "mine", "t": ..., "devices": [{"uuid": "MIG-...", "session": 12, "holder": "notebook:12",
     "model": "H200-SXM5-141GB", "profile": "1g.18gb", "util": 55.0, "mem_used": 900.0,
     "mem_total": 18432.0, "temp": 40.1, "power": 150.2}]}
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sessions.gpus.backends.base import GpuSample
from sessions.gpus.holders import Holder as SliceHolder
from sessions.gpus.holders import HolderKind


@dataclass(frozen=True)
class Holder:
    """Who holds a device: the slice's owner and what uses it (a notebook session, a render job)."""

    owner_id: int
    username: str
    held_by: SliceHolder | None

    @property
    def holder(self) -> str:
        """As the frames carry it: ``notebook:12``, or empty."""
        return str(self.held_by or "")

    @property
    def session_id(self) -> int | None:
        return self.held_by.id if self.held_by and self.held_by.kind == HolderKind.NOTEBOOK else None

    @property
    def job_id(self) -> int | None:
        """The render job holding the device, if a render job does."""
        return self.held_by.id if self.held_by and self.held_by.kind == HolderKind.RENDER else None

    @property
    def label(self) -> str:
        """As the live tiles show it: ``Render job #5``, or empty."""
        return self.held_by.label if self.held_by else ""


Holders = dict[str, list[Holder]]  # device (MIG or GPU) UUID -> who holds it; a shared GPU has several


def load_holders() -> Holders:
    """Every device in use now and who uses it, from the active slices."""
    from sessions.gpus.models import Slice

    holders: Holders = {}
    active = Slice.objects.filter(released_at__isnull=True).select_related("owner").order_by("pk")
    for taken in active.only("device_uuid", "owner__username", "holder_kind", "holder_id"):
        holders.setdefault(taken.device_uuid, []).append(Holder(taken.owner_id, taken.owner.username, taken.holder))
    return holders


def _users(holders: Iterable[Holder]) -> list[dict[str, Any]]:
    return [
        {"user": h.username, "session": h.session_id, "job": h.job_id, "holder": h.holder, "label": h.label}
        for h in holders
    ]


def fleet_frame(
    agent: str, t: float, samples: list[GpuSample], holders: Holders, hosts: dict[str, str], simulated: bool
) -> dict[str, Any]:
    gpus = []
    for gpu in samples:
        gpus.append(
            {
                "uuid": gpu.uuid,
                "host": hosts.get(gpu.uuid, agent),
                "index": gpu.index,
                "model": gpu.model_name,
                "util": gpu.utilization,
                "mem_used": gpu.memory_used_mib,
                "mem_total": gpu.memory_total_mib,
                "temp": gpu.temperature_c,
                "power": gpu.power_w,
                "sm_clock": gpu.sm_clock_mhz,
                "mem_clock": gpu.memory_clock_mhz,
                "ecc": gpu.ecc_errors,
                "procs": gpu.processes,
                "problem": gpu.problem,
                "users": _users(holders.get(gpu.uuid, [])),
                "devices": [
                    {
                        "uuid": device.uuid,
                        "gi": device.gi_id,
                        "profile": device.profile,
                        "util": device.utilization,
                        "mem_used": device.memory_used_mib,
                        "mem_total": device.memory_total_mib,
                        "users": _users(holders.get(device.uuid, [])),
                    }
                    for device in gpu.devices
                ],
            }
        )
    return {"kind": "fleet", "agent": agent, "t": round(t, 3), "simulated": simulated, "gpus": gpus}


def personal_frames(fleet: dict[str, Any], holders: Holders) -> dict[int, dict[str, Any]]:
    """Each person's own devices out of a fleet frame, with their GPU's temperature and power."""
    frames: dict[int, dict[str, Any]] = {}
    for gpu in fleet["gpus"]:
        rows = [(gpu, None)] + [(gpu, device) for device in gpu["devices"]]
        for parent, device in rows:
            source = device or parent
            for holder in holders.get(source["uuid"], []):
                frame = frames.setdefault(holder.owner_id, {"kind": "mine", "t": fleet["t"], "devices": []})
                frame["devices"].append(
                    {
                        "uuid": source["uuid"],
                        "session": holder.session_id,
                        "holder": holder.holder,
                        "model": parent["model"],
                        "profile": device["profile"] if device else "",
                        "util": source["util"],
                        "mem_used": source["mem_used"],
                        "mem_total": source["mem_total"],
                        "temp": parent["temp"],
                        "power": parent["power"],
                    }
                )
    return frames


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"))


def device_utilisation(texts: Iterable[str], now: float, max_age_s: float) -> dict[str, float | None]:
    """Each device's utilisation (GPU or MIG device, by UUID) out of fleet frames as the agent published them.

    None where the device reports none. A frame older than ``max_age_s`` says nothing (its agent has
    gone quiet); anything that is not a frame of ours is skipped: the store is data, never trusted.
    """
    found: dict[str, float | None] = {}
    for text in texts:
        try:
            frame = json.loads(text)
        except ValueError:
            continue
        t = _number(frame.get("t")) if isinstance(frame, dict) else None
        if t is None or now - t > max_age_s:
            continue
        for device in _devices(frame):
            found[device["uuid"]] = _number(device.get("util"))
    return found


def _devices(frame: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """The GPUs of a fleet frame and their MIG devices, each with a UUID."""
    gpus = frame.get("gpus")
    for gpu in gpus if isinstance(gpus, list) else []:
        if not isinstance(gpu, dict):
            continue
        devices = gpu.get("devices")
        for device in [gpu, *(devices if isinstance(devices, list) else [])]:
            if isinstance(device, dict) and isinstance(device.get("uuid"), str):
                yield device


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


STALE_AFTER_S = 3.0  # a frame older than this is no longer live: its agent went quiet (or the wire is slow)
SAMPLED_AT = re.compile(r'"t": ?([0-9.]+)')


def sampled_at(text: str) -> float | None:
    """When a frame (as text) was sampled, read off its head without parsing it."""
    found = SAMPLED_AT.search(text[:200])
    return float(found[1]) if found else None


def marked_if_stale(text: str, now: float) -> str:
    """A latest frame as it may be shown: one older than STALE_AFTER_S says so (``stale``, its ``age`` in
    seconds), so a page never shows a quiet agent's last figures as live."""
    t = sampled_at(text)
    if t is None or now - t <= STALE_AFTER_S or not text.endswith("}"):
        return text
    return f'{text[:-1]}, "stale": true, "age": {now - t:.1f}}}'
