"""Prices, the usages they are frozen into, and the totals billed so far."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from billing import money
from billing.models.base import AppendOnly, Market
from sessions.gpus.models import Slice


class Price(AppendOnly):
    """An hourly rate for one GPU model, kind and market, from ``effective_from`` until the next one."""

    model_name = models.CharField(max_length=64, help_text="Catalog model, e.g. A100-SXM4-80GB.")
    kind = models.CharField(max_length=10, choices=Slice.Kind.choices)
    profile = models.CharField(
        max_length=32, blank=True, help_text="The MIG profile (e.g. 3g.40gb); empty for a whole GPU or a share."
    )
    market = models.CharField(max_length=10, choices=Market.choices, default=Market.ON_DEMAND)
    per_hour = models.DecimalField(
        max_digits=12,
        decimal_places=money.RATE_PLACES,
        help_text="Per hour of what is held; for time-sliced shares of the whole GPU, of which each share pays 1/N.",
    )
    per_minute = models.DecimalField(max_digits=14, decimal_places=money.AMOUNT_PLACES, editable=False)
    effective_from = models.DateTimeField()
    source = models.CharField(max_length=300, blank=True, help_text="Where the figure comes from, or why it changed.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["model_name", "kind", "profile", "market", "-effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["model_name", "kind", "profile", "market", "effective_from"], name="price_one_per_moment"
            ),
            models.CheckConstraint(condition=Q(per_hour__gte=0), name="price_not_negative"),
        ]
        indexes = [
            models.Index(fields=["model_name", "kind", "profile", "market", "-effective_from"], name="price_lookup_idx")
        ]

    def __str__(self) -> str:
        return (
            f"{self.model_name} {self.label} {self.get_market_display()}: {self.per_hour}/h from {self.effective_from}"
        )

    never_changed = "A price is never changed; add a new one from a later moment."
    never_deleted = None  # until a usage froze it (PROTECT)

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.per_minute = money.per_minute(self.per_hour)
        super().save(*args, **kwargs)

    @property
    def label(self) -> str:
        if self.kind == Slice.Kind.MIG:
            return f"MIG {self.profile}"
        if self.kind == Slice.Kind.SHARED:
            return "time-sliced GPU, each of N shares 1/N"
        return "whole GPU"


class Usage(models.Model):
    """One holding of a slice as billing sees it: who, at which frozen rate, and how far it is charged."""

    slice = models.OneToOneField(Slice, on_delete=models.PROTECT, related_name="usage")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="usages")
    holder_kind = models.CharField(max_length=16)
    holder_id = models.PositiveBigIntegerField(null=True)
    market = models.CharField(max_length=10, choices=Market.choices)
    price = models.ForeignKey(Price, on_delete=models.PROTECT, related_name="usages")
    per_minute = models.DecimalField(
        max_digits=14, decimal_places=money.AMOUNT_PLACES, help_text="Frozen from the price in force at the start."
    )
    shares = models.PositiveSmallIntegerField(default=1, help_text="N of a time-sliced GPU at the start; else 1.")
    started = models.DateTimeField(help_text="The slice's held_from.")
    ended = models.DateTimeField(null=True, blank=True, help_text="The slice's held_until (or its release).")
    billed_minutes = models.PositiveIntegerField(default=0, help_text="Minutes 0 .. this - 1 are charged.")
    invoiced_minutes = models.PositiveIntegerField(
        default=0, db_default=0, help_text="Minutes 0 .. this - 1 are on issued invoices (net of minutes given back)."
    )
    open = models.BooleanField(default=True, help_text="Until it has ended and is charged to its end.")
    folded = models.BooleanField(
        default=False, db_default=False, help_text="Its minute rows were folded into daily rows (billing/rollup.py)."
    )

    class Meta:
        ordering = ["-started"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ended__isnull=True) | Q(ended__gte=F("started")), name="usage_ends_after_start"
            ),
        ]
        # The tick reads the open usages only: a partial index keeps that independent of history.
        indexes = [
            models.Index(fields=["id"], condition=Q(open=True), name="usage_open_idx"),
            models.Index(fields=["owner", "started"], name="usage_owner_idx"),
            # The roll-up's look for ended usages whose minutes are still rows: a few days' worth, never history.
            models.Index(fields=["ended"], condition=Q(open=False, folded=False), name="usage_to_fold_idx"),
        ]

    def __str__(self) -> str:
        return f"usage of slice {self.slice_id} by {self.owner_id} from {self.started}"


class BilledTotal(models.Model):
    """Minutes billed since the start, and their amount, for one GPU model, kind and market: what /metrics
    reads (billing/metrics.py), a few rows whatever the history. The meter adds to it in the statement that
    advances the usages' ``billed_minutes``, so it always equals their sum over every usage."""

    model_name = models.CharField(max_length=64)
    kind = models.CharField(max_length=10, choices=Slice.Kind.choices)
    market = models.CharField(max_length=10, choices=Market.choices)
    minutes = models.PositiveBigIntegerField(default=0)
    amount = models.DecimalField(max_digits=20, decimal_places=money.AMOUNT_PLACES, default=0)

    class Meta:
        ordering = ["model_name", "kind", "market"]
        constraints = [
            models.UniqueConstraint(fields=["model_name", "kind", "market"], name="billed_total_one_per_key")
        ]

    def __str__(self) -> str:
        return f"{self.minutes} minutes of {self.model_name} {self.kind} {self.market} billed"
