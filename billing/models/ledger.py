"""The double-entry ledger: accounts, balanced transactions and their entries, the charged minutes and the
daily roll-up."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from billing import money
from billing.models.base import AppendOnly
from billing.models.prices import Usage


class Account(models.Model):
    """A ledger account: a person's wallet, or one of the portal's own."""

    class Kind(models.TextChoices):
        WALLET = "wallet", "Wallet"
        REVENUE_ON_DEMAND = "revenue_on_demand", "Revenue, on-demand"
        REVENUE_SPOT = "revenue_spot", "Revenue, spot"
        PROMOTIONAL = "promotional", "Promotional credit given"
        TOP_UPS = "top_ups", "Top-ups received"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="accounts"
    )

    class Meta:
        ordering = ["kind", "user_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "user"], condition=Q(user__isnull=False), name="account_one_per_user"
            ),
            models.UniqueConstraint(fields=["kind"], condition=Q(user__isnull=True), name="account_one_of_the_portal"),
            models.CheckConstraint(
                condition=Q(kind="wallet", user__isnull=False) | (~Q(kind="wallet") & Q(user__isnull=True)),
                name="account_wallets_belong_to_people",
            ),
        ]

    def __str__(self) -> str:
        return f"wallet of user {self.user_id}" if self.user_id else self.get_kind_display()


class LedgerTransaction(models.Model):
    """Entries posted together; their amounts sum to zero."""

    class Kind(models.TextChoices):
        USAGE = "usage", "Per-minute charges"
        GRANT = "grant", "Promotional credit"
        TOP_UP = "top_up", "Top-up"
        REVERSAL = "reversal", "Reversal"
        SETTLEMENT = "settlement", "Minutes past a holding's end given back"

    kind = models.CharField(max_length=10, choices=Kind.choices)
    posted_at = models.DateTimeField(default=timezone.now)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="ledger_transactions"
    )
    memo = models.CharField(max_length=300, blank=True, help_text="Why: the reason staff gave, or what was charged.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    reverses = models.OneToOneField("self", on_delete=models.PROTECT, null=True, blank=True, related_name="reversed_by")
    key = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",
        help_text="The form's one-time key it was posted with: a form sent twice posts once.",
    )

    class Meta:
        ordering = ["-posted_at", "-id"]
        indexes = [models.Index(fields=["user", "posted_at"], name="ledger_txn_user_idx")]
        constraints = [models.UniqueConstraint(fields=["key"], condition=~Q(key=""), name="ledger_txn_key_once")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} at {self.posted_at}"


class Entry(AppendOnly):
    """One line of a ledger transaction: an amount added to an account's balance (negative: taken off)."""

    transaction = models.ForeignKey(LedgerTransaction, on_delete=models.PROTECT, related_name="entries")
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries")
    amount = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)

    class Meta:
        verbose_name_plural = "entries"
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.amount} to {self.account}"

    never_changed = never_deleted = "Ledger entries are append-only; post a reversing transaction instead."


class ChargedMinute(models.Model):
    """Minute ``minute`` (0 is the first) of a usage, charged once, by the ledger transaction named.

    The tick writes about 100,000 of these a minute, so the database checks no foreign key per row (the
    checks were a quarter of the tick): the one statement that writes them takes the usage from its row
    and the transaction from the insert beside it, and neither is ever deleted (PROTECT, the ledger's
    append-only rule). The unique key also serves every look-up by usage.
    """

    usage = models.ForeignKey(
        Usage, on_delete=models.PROTECT, related_name="minutes", db_constraint=False, db_index=False
    )
    minute = models.PositiveIntegerField()
    transaction = models.ForeignKey(
        LedgerTransaction, on_delete=models.PROTECT, related_name="minutes", db_constraint=False
    )

    class Meta:
        ordering = ["usage", "minute"]
        constraints = [models.UniqueConstraint(fields=["usage", "minute"], name="minute_charged_once")]

    def __str__(self) -> str:
        return f"minute {self.minute} of usage {self.usage_id}"


class UsageDay(models.Model):
    """The charged minutes of an ended usage that began on one UTC day: its minute rows folded into one
    (billing/rollup.py) once it ended PORTAL_BILLING_MINUTE_DAYS ago. Minutes ``first_minute`` to
    ``first_minute + minutes - 1``, at the usage's frozen rate, ``amount`` in all."""

    usage = models.ForeignKey(Usage, on_delete=models.PROTECT, related_name="days", db_index=False)
    day = models.DateField()
    first_minute = models.PositiveIntegerField()
    minutes = models.PositiveIntegerField()
    amount = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)

    class Meta:
        ordering = ["usage", "day"]
        constraints = [models.UniqueConstraint(fields=["usage", "day"], name="usage_day_once")]
        indexes = [models.Index(fields=["day"], name="usage_day_idx")]  # a month's report reads its days only

    def __str__(self) -> str:
        return f"{self.minutes} minutes of usage {self.usage_id} on {self.day}"
