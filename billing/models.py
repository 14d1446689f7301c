"""Billing records: prices, usages and their charged minutes, and the double-entry ledger.

A usage is one holding of a slice (``Slice.held_from`` to ``Slice.held_until``)
with the rate frozen from the price in force when it began; each of its started
minutes is one ``ChargedMinute`` row, unique per (usage, minute), written in the
same database transaction as the ledger entries that charge it. Ledger rows are
append-only: a correction is a reversing transaction (PostgreSQL refuses an
update, a delete and an unbalanced transaction: migration 0003).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from billing import money
from sessions.gpus.models import Slice


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


class Budget(models.Model):
    """A monthly spending figure for one person or one group: alerts at 50, 80 and 100 % of it (no stop)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="budget"
    )
    group = models.OneToOneField(Group, on_delete=models.CASCADE, null=True, blank=True, related_name="budget")
    monthly = models.DecimalField(max_digits=14, decimal_places=money.SHOWN_PLACES, help_text="Per calendar month.")
    set_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, related_name="+")
    set_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False),
                name="budget_of_a_person_or_a_group",
            ),
            models.CheckConstraint(condition=Q(monthly__gt=0), name="budget_positive"),
        ]

    def __str__(self) -> str:
        return f"budget of {self.user or self.group}: {self.monthly} a month"


class BudgetAlert(models.Model):
    """A threshold of a budget crossed in a month: one row, so the alert is shown and pushed exactly once;
    its mail is marked sent only once the mail server has taken it, and given up (recorded, for staff to
    see) after a week of failures."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    month = models.DateField(help_text="The first day of the (UTC) month.")
    threshold = models.PositiveSmallIntegerField(help_text="Percent: 50, 80 or 100.")
    spent = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    sent_at = models.DateTimeField(default=timezone.now, help_text="When it was recorded, shown and pushed.")
    mail_due = models.BooleanField(
        default=False, db_default=False, help_text="Its mail is still to go out: a failed send is tried again."
    )
    mailed_at = models.DateTimeField(null=True, blank=True, help_text="When the mail server took its mail.")
    mail_error = models.CharField(max_length=300, blank=True, help_text="Why its mail's last send failed.")
    mail_given_up_at = models.DateTimeField(
        null=True, blank=True, help_text="When its mail, failing for a week, was given up: it never went out."
    )

    class Meta:
        ordering = ["-sent_at", "-threshold"]
        constraints = [
            models.UniqueConstraint(fields=["budget", "month", "threshold"], name="budget_alert_once"),
        ]

    def __str__(self) -> str:
        return f"{self.threshold} % of {self.budget} in {self.month:%Y-%m}"


class CreditStop(models.Model):
    """A person's balance reached zero while they held slices: warned at ``warned_at``, their sessions
    stopped after the grace period (``stopped_at``), or credit came back first (``cleared_at``)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credit_stops")
    warned_at = models.DateTimeField(default=timezone.now)
    stop_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    cleared_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-warned_at"]
        constraints = [
            models.UniqueConstraint(fields=["user"], condition=Q(cleared_at__isnull=True), name="credit_stop_one_open"),
        ]

    def __str__(self) -> str:
        return f"zero balance of user {self.user_id} from {self.warned_at}"


class Issued(AppendOnly):
    """An issued document: written once, never changed or deleted (PostgreSQL refuses too: migration 0007)."""

    never_changed = "An issued invoice is never changed; a credit note reverses it."
    never_deleted = "An issued invoice is never deleted; a credit note reverses it."

    class Meta:
        abstract = True


class Invoice(Issued):
    """One person's charges for one calendar month (UTC), from the minutes the meter charged (billing/invoices.py)."""

    number = models.PositiveIntegerField(unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="invoices")
    month = models.DateField(help_text="The first day of the (UTC) month.")
    issued_at = models.DateTimeField(default=timezone.now)
    currency = models.CharField(max_length=8)
    minutes = models.IntegerField(help_text="Its lines' minutes: those charged, less those given back.")
    total = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    opening_balance = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    credit_added = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    credit_applied = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    balance_due = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)

    class Meta:
        ordering = ["-month", "-number"]
        constraints = [models.UniqueConstraint(fields=["user", "month"], name="invoice_one_per_person_month")]

    def __str__(self) -> str:
        return f"invoice {self.label} of user {self.user_id} for {self.month:%Y-%m}"

    @property
    def label(self) -> str:
        return f"INV-{self.number:06d}"


class InvoiceLine(Issued):
    """One usage's charged minutes not on an earlier invoice that began before the end of the invoice's month
    (its own, or an earlier one's charged late), at its frozen rate; or, with negative minutes, minutes an
    earlier invoice listed that were given back (charged past the holding's end)."""

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="lines")
    usage = models.ForeignKey(Usage, on_delete=models.PROTECT, related_name="invoice_lines")
    holder_kind = models.CharField(max_length=16)
    holder_id = models.PositiveBigIntegerField(null=True)
    gpu_model = models.CharField(max_length=64)
    kind = models.CharField(max_length=10, choices=Slice.Kind.choices)
    profile = models.CharField(max_length=32, blank=True)
    market = models.CharField(max_length=10, choices=Market.choices)
    started = models.DateTimeField()
    ended = models.DateTimeField(null=True, blank=True)
    first_minute = models.PositiveIntegerField()
    minutes = models.IntegerField(help_text="Negative: minutes an earlier invoice listed, given back.")
    per_minute = models.DecimalField(max_digits=14, decimal_places=money.AMOUNT_PLACES)
    amount = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)

    class Meta:
        ordering = ["invoice", "started", "id"]
        constraints = [models.UniqueConstraint(fields=["invoice", "usage"], name="invoice_line_one_per_usage")]

    def __str__(self) -> str:
        return f"{self.minutes} minutes of usage {self.usage_id} on invoice {self.invoice_id}"


class CreditNote(Issued):
    """Reverses an issued invoice in full: its amount back to the wallet, with who and why."""

    number = models.PositiveIntegerField(unique=True)
    invoice = models.OneToOneField(Invoice, on_delete=models.PROTECT, related_name="credit_note")
    amount = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    reason = models.CharField(max_length=300)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    issued_at = models.DateTimeField(default=timezone.now)
    transaction = models.OneToOneField(LedgerTransaction, on_delete=models.PROTECT, related_name="credit_note")

    class Meta:
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"credit note {self.label} reversing {self.invoice}"

    @property
    def label(self) -> str:
        return f"CN-{self.number:06d}"


class BilledGroup(models.Model):
    """A Django group staff bill as one: each month it gets a group invoice of its members' charges, addressed
    to it (billing/group_invoices.py). The money still comes from each member's own wallet."""

    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="billed")
    billing_name = models.CharField(max_length=200, help_text="Who the invoice is addressed to, e.g. a department.")
    billing_email = models.EmailField(blank=True)
    marked_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    marked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["group__name"]

    def __str__(self) -> str:
        return f"group {self.group} billed to {self.billing_name}"


class BilledGroupChange(AppendOnly):
    """Who billed a group, changed whom it is billed to, or stopped billing it, when, and why: written once and
    never changed, like a credit grant in the ledger (PostgreSQL refuses changes too: migration 0011). A group
    with such a record is kept (PROTECT), as its invoices keep it."""

    class Action(models.TextChoices):
        MARKED = "marked", "Billed"
        CHANGED = "changed", "Billed to changed"
        STOPPED = "stopped", "Billing stopped"

    group = models.ForeignKey(Group, on_delete=models.PROTECT, related_name="billing_changes")
    action = models.CharField(max_length=10, choices=Action.choices)
    billing_name = models.CharField(max_length=200, help_text="Whom its invoices go to from then (stopped: went to).")
    billing_email = models.EmailField(blank=True)
    reason = models.CharField(max_length=300, blank=True, help_text="Why; required to stop billing a group.")
    by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.get_action_display()}: group {self.group_id} by {self.by_id} at {self.at}"

    never_changed = "A billed group's change is recorded once and never changed."
    never_deleted = "A billed group's change is recorded once and never deleted."


class GroupInvoice(Issued):
    """A billed group's month: the invoices of the members charged in it, addressed to the group."""

    number = models.PositiveIntegerField(unique=True)
    group = models.ForeignKey(Group, on_delete=models.PROTECT, related_name="group_invoices")
    month = models.DateField(help_text="The first day of the (UTC) month.")
    issued_at = models.DateTimeField(default=timezone.now)
    billing_name = models.CharField(max_length=200)
    billing_email = models.EmailField(blank=True)
    currency = models.CharField(max_length=8)
    minutes = models.PositiveIntegerField()
    total = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    credit_applied = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    balance_due = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)

    class Meta:
        ordering = ["-month", "-number"]
        constraints = [models.UniqueConstraint(fields=["group", "month"], name="group_invoice_one_per_group_month")]
        permissions = [("view_own_group_invoices", "Can see the invoices of the billed groups they are a member of")]

    def __str__(self) -> str:
        return f"group invoice {self.label} of {self.group} for {self.month:%Y-%m}"

    @property
    def label(self) -> str:
        return f"GRP-{self.number:06d}"


class GroupInvoiceMember(Issued):
    """One member on a group invoice: their own invoice of the month (whose lines the group invoice lists)
    and its totals, and the other billed groups whose invoices list the same charges."""

    group_invoice = models.ForeignKey(GroupInvoice, on_delete=models.PROTECT, related_name="members")
    member = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="group_lines")
    minutes = models.PositiveIntegerField()
    total = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    credit_applied = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    balance_due = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    also_billed_to = models.CharField(
        max_length=500, blank=True, help_text="The other billed groups the member was in when this was issued."
    )

    class Meta:
        ordering = ["group_invoice", "id"]  # written in the order of the members' user names
        constraints = [
            models.UniqueConstraint(fields=["group_invoice", "member"], name="group_invoice_member_once"),
        ]

    def __str__(self) -> str:
        return f"{self.invoice} on {self.group_invoice}"
