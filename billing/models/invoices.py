"""Invoices, their lines and credit notes, and groups billed together with their invoices."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.utils import timezone

from billing import money
from billing.models.base import AppendOnly, Market
from billing.models.ledger import LedgerTransaction
from billing.models.prices import Usage
from sessions.gpus.models import Slice


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
