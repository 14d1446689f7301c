"""Who may see the money, the markets, and the append-only rule every money record keeps."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import models


class FinanceAccess(models.Model):
    """Carries the permission that opens the finance views; it has no table."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("view_finance", "Can see revenue, usage and every account's money")]

    def __str__(self) -> str:
        return "finance access"


class Market(models.TextChoices):
    ON_DEMAND = "on_demand", "On-demand"
    SPOT = "spot", "Spot"


class AppendOnly(models.Model):
    """A record written once: changing it is refused with ``never_changed``, deleting it with ``never_deleted``
    (None: it may be deleted, as a price nothing was billed by). PostgreSQL's triggers refuse the same for the
    ledger, invoices and group changes (migrations 0003, 0007, 0008, 0011); SQLite has only this."""

    never_changed = "This record is written once and never changed."
    never_deleted: str | None = "This record is written once and never deleted."

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValidationError(self.never_changed)
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        if self.never_deleted is not None:
            raise ValidationError(self.never_deleted)
        return super().delete(*args, **kwargs)
