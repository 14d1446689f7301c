"""Per-minute GPU history: what the live charts showed, kept for reloads, idle culling and reports."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class GpuMinute(models.Model):
    """One minute of one device: a physical GPU (device_uuid == gpu_uuid) or a MIG device on it.

    A MIG device's row carries its own utilisation and memory and its GPU's temperature and
    power (those exist only per physical GPU). A None figure is one the device does not report.
    """

    minute = models.DateTimeField(help_text="Start of the minute (UTC).")
    host = models.CharField(max_length=100)
    gpu_uuid = models.CharField(max_length=64)
    device_uuid = models.CharField(max_length=64)
    profile = models.CharField(max_length=32, blank=True, help_text="MIG profile; blank for a whole GPU.")
    holder = models.CharField(max_length=100, blank=True, help_text="What used it, e.g. notebook:12.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    session_id = models.BigIntegerField(null=True, blank=True, help_text="The notebook session it served.")
    samples = models.PositiveIntegerField()
    util_mean = models.FloatField(null=True, blank=True)
    util_max = models.FloatField(null=True, blank=True)
    memory_used_mean = models.FloatField(null=True, blank=True, help_text="MiB")
    memory_used_max = models.FloatField(null=True, blank=True, help_text="MiB")
    memory_total = models.FloatField(null=True, blank=True, help_text="MiB")
    temperature_mean = models.FloatField(null=True, blank=True)
    temperature_max = models.FloatField(null=True, blank=True)
    power_mean = models.FloatField(null=True, blank=True)
    power_max = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["minute"]
        constraints = [
            models.UniqueConstraint(fields=["device_uuid", "holder", "minute"], name="gpuminute_unique_device_minute")
        ]
        indexes = [
            models.Index(fields=["session_id", "minute"]),
            models.Index(fields=["minute"]),
        ]

    def __str__(self) -> str:
        return f"{self.device_uuid} at {self.minute:%Y-%m-%d %H:%M}"
