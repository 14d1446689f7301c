"""What each person may keep on the portal's disk, and what they keep there as last measured.

A quota is the setting PORTAL_STORAGE_QUOTA_BYTES unless a group of theirs has one (the largest of their groups'
applies) or they have one of their own; operators set both in the admin. ``StorageUse`` holds one row per thing
that takes their disk (a render job's folder, an upload on its way, their notebook work folder, a notebook
container's own files), kept up to date by whoever changes it and by a periodic measure, so a person's use is
one sum, never a walk of their folders on a request.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

GIB = 1024**3


def _gib_field() -> models.DecimalField[Decimal, Decimal]:
    return models.DecimalField(
        "quota (GiB)",
        max_digits=12,
        decimal_places=3,
        validators=[MinValueValidator(Decimal("0.001"))],
        help_text="GiB (1024³ bytes); decimals allowed, e.g. 0.5 for 512 MiB.",
    )


class StorageQuota(models.Model):
    """A person's own storage quota, overriding their groups' and PORTAL_STORAGE_QUOTA_BYTES."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="storage_quota")
    gib = _gib_field()

    class Meta:
        verbose_name, verbose_name_plural = "storage quota of a person", "storage quotas of people"

    def __str__(self) -> str:
        return f"{self.user}: {self.gib} GiB"

    @property
    def max_bytes(self) -> int:
        return int(self.gib * GIB)


class GroupStorageQuota(models.Model):
    """A group's storage quota for each of its members (the largest of a person's groups' applies), overriding
    PORTAL_STORAGE_QUOTA_BYTES; a person's own quota overrides it."""

    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="storage_quota")
    gib = _gib_field()

    class Meta:
        verbose_name, verbose_name_plural = "storage quota of a group", "storage quotas of groups"

    def __str__(self) -> str:
        return f"{self.group}: {self.gib} GiB per member"

    @property
    def max_bytes(self) -> int:
        return int(self.gib * GIB)


class StorageUse(models.Model):
    """One thing that takes a person's disk, as last measured (an upload on its way: at its declared length)."""

    class Kind(models.TextChoices):
        RENDER_JOB = "render_job", "Render job"
        UPLOAD = "upload", "Upload on its way"
        WORK_VOLUME = "work_volume", "Notebook work folder"
        CONTAINER_LAYER = "container_layer", "Notebook session's own files"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="storage_uses")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    key = models.CharField(max_length=100, help_text="The job's id, the upload's token, the volume's name ...")
    label = models.CharField(max_length=255, help_text="What its owner calls it: the scene's name, the session's.")
    url = models.CharField(max_length=200, blank=True, help_text="Its page.")
    bytes = models.PositiveBigIntegerField(default=0)
    parts = models.JSONField(default=dict, blank=True, help_text="Bytes of its parts by name: scene, frames.")
    measured_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "key"], name="storage_use_unique_thing")]
        indexes = [models.Index(fields=["owner", "kind"], name="storage_use_owner_idx")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.label} of {self.owner}: {self.bytes} bytes"
