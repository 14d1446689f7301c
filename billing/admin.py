"""Billing in the Django admin: prices are added (never edited) through the same checks as the staff
page; usages, minutes, daily roll-ups, the ledger, budgets and their alerts, invoices and credit notes
are read-only records, and so are group invoices and the record of who billed which group; staff mark
which groups are billed here too."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from billing import group_invoices, prices
from billing.models import (
    Account,
    BilledGroup,
    BilledGroupChange,
    BilledTotal,
    Budget,
    BudgetAlert,
    ChargedMinute,
    CreditNote,
    CreditStop,
    Entry,
    GroupInvoice,
    GroupInvoiceMember,
    Invoice,
    InvoiceLine,
    LedgerTransaction,
    Price,
    Usage,
    UsageDay,
)


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PriceAdminForm(forms.ModelForm[Price]):
    per_hour = forms.CharField(help_text="At most four decimals.")

    class Meta:
        model = Price
        fields = ["model_name", "kind", "profile", "market", "per_hour", "effective_from", "source"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            data["per_hour"] = prices.parse_per_hour(data.get("per_hour", ""))
            key = prices.PriceKey(data["model_name"], data["kind"], data.get("profile", ""), data["market"])
            prices.check_key(key)
            prices.check_moment(key, data["effective_from"])  # here, so a refusal is said on the form, not a 500
        except (KeyError, ValidationError) as error:
            raise ValidationError(getattr(error, "messages", ["Fill in every field."])) from None
        return data


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin[Price]):
    form = PriceAdminForm
    list_display = ["model_name", "kind", "profile", "market", "per_hour", "per_minute", "effective_from", "created_by"]
    list_filter = ["model_name", "kind", "market"]

    def has_change_permission(self, request: HttpRequest, obj: Price | None = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Price | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Price, form: Any, change: bool) -> None:
        """Through the price service, which refuses a moment that would reprice a running holding."""
        key = prices.PriceKey(obj.model_name, obj.kind, obj.profile, obj.market)
        user = request.user
        assert user.is_authenticated
        added = prices.add_price(key, obj.per_hour, obj.effective_from, by=user, source=obj.source)
        obj.pk = added.pk


@admin.register(Usage)
class UsageAdmin(ReadOnly):
    list_display = [
        "slice",
        "owner",
        "holder_kind",
        "holder_id",
        "market",
        "per_minute",
        "started",
        "ended",
        "billed_minutes",
        "open",
    ]
    list_filter = ["open", "market", "holder_kind"]


@admin.register(ChargedMinute)
class ChargedMinuteAdmin(ReadOnly):
    list_display = ["usage", "minute", "transaction"]


@admin.register(Account)
class AccountAdmin(ReadOnly):
    list_display = ["__str__", "kind", "user"]
    list_filter = ["kind"]


class EntryInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Entry
    fields = ["account", "amount"]
    readonly_fields = ["account", "amount"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(LedgerTransaction)
class LedgerTransactionAdmin(ReadOnly):
    list_display = ["__str__", "kind", "user", "memo", "created_by", "posted_at"]
    list_filter = ["kind"]
    inlines = [EntryInline]


@admin.register(Entry)
class EntryAdmin(ReadOnly):
    list_display = ["transaction", "account", "amount"]


@admin.register(BilledTotal)
class BilledTotalAdmin(ReadOnly):
    """/metrics' totals, which only the meter adds to."""

    list_display = ["model_name", "kind", "market", "minutes", "amount"]


@admin.register(UsageDay)
class UsageDayAdmin(ReadOnly):
    list_display = ["usage", "day", "first_minute", "minutes", "amount"]
    date_hierarchy = "day"


# Budgets are set, and alerts and zero-balance stops written, through billing/budgets.py's and
# billing/credit.py's checks (the Credit page and the person's own); the admin shows them.
@admin.register(Budget)
class BudgetAdmin(ReadOnly):
    list_display = ["__str__", "user", "group", "monthly", "set_by", "set_at"]


class MailFilter(admin.SimpleListFilter):
    """Staff find the alerts whose mail never went out: given up after a week of failures, or still due."""

    title = "mail"
    parameter_name = "mail"
    CHOICES = {
        "given_up": Q(mail_given_up_at__isnull=False),
        "due": Q(mail_due=True),
        "sent": Q(mailed_at__isnull=False),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("given_up", "Given up"), ("due", "Still due"), ("sent", "Sent")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[BudgetAlert]) -> QuerySet[BudgetAlert]:
        wanted = self.CHOICES.get(self.value() or "")
        return queryset.filter(wanted) if wanted is not None else queryset


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnly):
    list_display = ["budget", "month", "threshold", "spent", "sent_at", "mail", "mail_error"]
    list_filter = [MailFilter]

    @admin.display(description="Mail")
    def mail(self, alert: BudgetAlert) -> str:
        if alert.mailed_at:
            return f"sent {alert.mailed_at:%Y-%m-%d %H:%M}"
        if alert.mail_given_up_at:
            return f"GIVEN UP {alert.mail_given_up_at:%Y-%m-%d %H:%M} after a week of failures: never sent"
        return "due: tried again at the next check" if alert.mail_due else "no address to mail"


@admin.register(CreditStop)
class CreditStopAdmin(ReadOnly):
    list_display = ["user", "warned_at", "stop_at", "stopped_at", "cleared_at"]


# Invoices are immutable once issued (billing/invoices.py); a correction is a credit note, made there.
@admin.register(Invoice)
class InvoiceAdmin(ReadOnly):
    list_display = ["number", "user", "month", "minutes", "total", "credit_applied", "balance_due", "issued_at"]
    list_filter = ["month"]


@admin.register(InvoiceLine)
class InvoiceLineAdmin(ReadOnly):
    list_display = ["invoice", "usage", "gpu_model", "kind", "profile", "market", "minutes", "per_minute", "amount"]


@admin.register(CreditNote)
class CreditNoteAdmin(ReadOnly):
    list_display = ["number", "invoice", "amount", "reason", "created_by", "issued_at"]


@admin.register(BilledGroup)
class BilledGroupAdmin(admin.ModelAdmin[BilledGroup]):
    """Which groups are billed and to whom (also on the portal's Billed groups page). Marking and changing go
    through the service, which records who and when; stopping needs a reason, so it is done on that page."""

    list_display = ["group", "billing_name", "billing_email", "marked_by", "marked_at"]
    fields = ["group", "billing_name", "billing_email", "marked_by", "marked_at"]
    readonly_fields = ["marked_by", "marked_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: BilledGroup | None = None) -> list[str]:
        return [*self.readonly_fields, "group"] if obj is not None else list(self.readonly_fields)

    def has_delete_permission(self, request: HttpRequest, obj: BilledGroup | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: BilledGroup, form: Any, change: bool) -> None:
        user = request.user
        assert isinstance(user, User)
        saved = group_invoices.mark(obj.group, obj.billing_name, obj.billing_email, by=user)
        obj.pk, obj.marked_by, obj.marked_at = saved.pk, saved.marked_by, saved.marked_at


@admin.register(BilledGroupChange)
class BilledGroupChangeAdmin(ReadOnly):
    list_display = ["at", "group", "action", "billing_name", "by", "reason"]
    list_filter = ["action"]


@admin.register(GroupInvoice)
class GroupInvoiceAdmin(ReadOnly):
    list_display = ["number", "group", "month", "billing_name", "minutes", "total", "credit_applied", "issued_at"]
    list_filter = ["month"]


@admin.register(GroupInvoiceMember)
class GroupInvoiceMemberAdmin(ReadOnly):
    list_display = ["group_invoice", "member", "invoice", "minutes", "total", "credit_applied", "also_billed_to"]
