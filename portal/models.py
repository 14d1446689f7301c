"""Small records the portal itself keeps: background-worker heartbeats."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class WorkerHeartbeat(models.Model):
    """The last time a background process (Celery worker via beat, later the GPU agent) reported in."""

    name = models.CharField(max_length=100, unique=True)
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} @ {self.seen_at:%Y-%m-%d %H:%M:%S}"

    def age_seconds(self) -> float:
        return (timezone.now() - self.seen_at).total_seconds()

    def is_stale(self, limit_seconds: float = 180) -> bool:
        return self.age_seconds() > limit_seconds

    @classmethod
    def beat(cls, name: str) -> WorkerHeartbeat:
        heartbeat, _ = cls.objects.update_or_create(name=name, defaults={"seen_at": timezone.now()})
        return heartbeat
