"""Per-minute aggregates (mean and max) of the live frames, and the questions asked of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Max
from django.utils import timezone

from sessions.metrics.frames import Holder, Holders
from sessions.metrics.models import GpuMinute

FIGURES = ("util", "memory_used", "temperature", "power")


@dataclass
class _Figure:
    total: float = 0.0
    count: int = 0
    top: float | None = None

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.total += value
        self.count += 1
        self.top = value if self.top is None else max(self.top, value)

    @property
    def mean(self) -> float | None:
        return round(self.total / self.count, 2) if self.count else None


@dataclass
class _Device:
    host: str
    gpu_uuid: str
    device_uuid: str
    profile: str
    holder: Holder | None
    memory_total: float | None = None
    samples: int = 0
    figures: dict[str, _Figure] = field(default_factory=lambda: {name: _Figure() for name in FIGURES})

    def row(self, minute: datetime) -> GpuMinute:
        f = self.figures
        return GpuMinute(
            minute=minute,
            host=self.host,
            gpu_uuid=self.gpu_uuid,
            device_uuid=self.device_uuid,
            profile=self.profile,
            holder=self.holder.holder if self.holder else "",
            owner_id=self.holder.owner_id if self.holder else None,
            session_id=self.holder.session_id if self.holder else None,
            samples=self.samples,
            util_mean=f["util"].mean,
            util_max=f["util"].top,
            memory_used_mean=f["memory_used"].mean,
            memory_used_max=f["memory_used"].top,
            memory_total=self.memory_total,
            temperature_mean=f["temperature"].mean,
            temperature_max=f["temperature"].top,
            power_mean=f["power"].mean,
            power_max=f["power"].top,
        )


class MinuteBuffer:
    """Collects frames; hands back the finished minute's rows when a frame of a later minute arrives."""

    def __init__(self) -> None:
        self.minute: datetime | None = None
        self.devices: dict[tuple[str, str], _Device] = {}

    def add(self, frame: dict[str, Any], holders: Holders) -> list[GpuMinute]:
        moment = datetime.fromtimestamp(frame["t"], tz=UTC)
        minute = moment.replace(second=0, microsecond=0)
        finished = self.flush() if self.minute is not None and minute != self.minute else []
        self.minute = minute
        for gpu in frame["gpus"]:
            if gpu["problem"]:
                continue
            self._add(gpu, gpu, "", holders)
            for device in gpu["devices"]:
                self._add(gpu, device, device["profile"], holders)
        return finished

    def _add(self, gpu: dict[str, Any], source: dict[str, Any], profile: str, holders: Holders) -> None:
        found: list[Holder | None] = list(holders.get(source["uuid"], []))
        for holder in found or [None]:
            key = (source["uuid"], holder.holder if holder else "")
            entry = self.devices.get(key)
            if entry is None:
                entry = self.devices[key] = _Device(gpu["host"], gpu["uuid"], source["uuid"], profile, holder)
            entry.samples += 1
            entry.memory_total = source["mem_total"]
            for name, value in zip(
                FIGURES, (source["util"], source["mem_used"], gpu["temp"], gpu["power"]), strict=True
            ):
                entry.figures[name].add(value)

    def flush(self) -> list[GpuMinute]:
        if self.minute is None:
            return []
        rows = [device.row(self.minute) for device in self.devices.values() if device.samples]
        self.devices = {}
        return rows


def save(rows: Iterable[GpuMinute]) -> int:
    """Store rows; a minute already stored (an agent restarted within it) is kept as it was."""
    return len(GpuMinute.objects.bulk_create(list(rows), ignore_conflicts=True))


def session_history(session_id: int) -> list[dict[str, Any]]:
    """A session's whole history, one point per minute, for its page's chart."""
    rows = GpuMinute.objects.filter(session_id=session_id).order_by("minute")
    return [
        {
            "t": row.minute.timestamp(),
            "util": row.util_mean,
            "util_max": row.util_max,
            "mem_used": row.memory_used_mean,
            "mem_total": row.memory_total,
            "temp": row.temperature_mean,
            "power": row.power_mean,
        }
        for row in rows
    ]


def last_busy_minutes(session_ids: Iterable[int], threshold: float) -> dict[int, datetime]:
    """For each session, the end of the last minute its GPU utilisation reached ``threshold``."""
    busy = (
        GpuMinute.objects.filter(session_id__in=list(session_ids), util_max__gte=threshold)
        .values("session_id")
        .annotate(last=Max("minute"))
    )
    return {row["session_id"]: row["last"] + timedelta(minutes=1) for row in busy}


def delete_older_than(days: int) -> int:
    deleted, _ = GpuMinute.objects.filter(minute__lt=timezone.now() - timedelta(days=days)).delete()
    return deleted
