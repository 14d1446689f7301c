"""Group invoices: each month, one per billed group, addressed to the group, listing its members' charges.

Money still comes from each member's own wallet, so a group invoice is made of its members' own invoices
of the month (issued first where they are not yet): their lines, and each member's total and the credit
their wallet applied, copied when it is issued and never changed (a correction is a credit note on the
member's invoice, which the group invoice shows beside that member). Members are the group's when it is
issued; someone in two billed groups is on both, and each says so. Staff see every group invoice; a
member sees their group's only with ``billing.view_own_group_invoices`` (it shows every member's usage,
which members never see of each other otherwise); anyone else gets 404.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, Group, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.http import Http404, HttpResponse
from django.utils import timezone

from billing import invoices, money
from billing.models import (
    BilledGroup,
    BilledGroupChange,
    CreditNote,
    GroupInvoice,
    GroupInvoiceMember,
    Invoice,
    InvoiceLine,
)
from portal.roles import is_operator

PERMISSION = "billing.view_own_group_invoices"
ISSUE_ATTEMPTS = 3


# Which groups are billed


def mark(group: Group, billing_name: str, billing_email: str, by: User) -> BilledGroup:
    """Staff bill a group (or change whom its invoices are addressed to); who did it, and when, is recorded."""
    if not is_operator(by):
        raise PermissionDenied("Only staff decide which groups are billed.")
    if not billing_name.strip():
        raise ValidationError("Say whom the group's invoices are addressed to.", code="no_billing_name")
    with transaction.atomic():
        billed, created = BilledGroup.objects.update_or_create(
            group=group,
            defaults={
                "billing_name": billing_name.strip(),
                "billing_email": billing_email.strip(),
                "marked_by": by,
                "marked_at": timezone.now(),
            },
        )
        action = BilledGroupChange.Action.MARKED if created else BilledGroupChange.Action.CHANGED
        _record(billed, action, by, reason="")
    return billed


def unmark(group: Group, by: User, reason: str) -> None:
    """Staff stop billing a group, saying why; the invoices it was issued stay as they are, and who stopped
    it, when and why is recorded. A group not billed is left as it is."""
    if not is_operator(by):
        raise PermissionDenied("Only staff decide which groups are billed.")
    if not reason.strip():
        raise ValidationError("Say why the group is no longer billed.", code="no_reason")
    with transaction.atomic():
        billed = BilledGroup.objects.select_for_update().filter(group=group).first()
        if billed is None:
            raise ValidationError(f"Group {group.name} is not billed.", code="not_billed")
        _record(billed, BilledGroupChange.Action.STOPPED, by, reason)
        billed.delete()


def _record(billed: BilledGroup, action: str, by: User, reason: str) -> None:
    BilledGroupChange.objects.create(
        group=billed.group,
        action=action,
        billing_name=billed.billing_name,
        billing_email=billed.billing_email,
        reason=reason.strip()[:300],
        by=by,
    )


# Issuing


def issue(group: Group, month: date) -> GroupInvoice | None:
    """Issue a billed group's invoice for a month that has ended; the one already issued if there is one,
    None if no member was charged in the month."""
    month = month.replace(day=1)
    invoices.month_over(month)
    billed = BilledGroup.objects.filter(group=group).select_related("group").first()
    if billed is None:
        raise ValidationError(f"Group {group.name} is not billed.", code="not_billed")
    existing = GroupInvoice.objects.filter(group=group, month=month).first()
    if existing is not None:
        return existing
    members = group.user_set.order_by("username")
    own = [(member, mine) for member in members if (mine := invoices.issue(member, month)) is not None]
    for _attempt in range(ISSUE_ATTEMPTS):
        try:
            with transaction.atomic():
                return _issue_once(billed, month, own)
        except IntegrityError:  # SQLite, which takes no lock: another process took this number or this month
            found = GroupInvoice.objects.filter(group=group, month=month).first()
            if found is not None:
                return found
    raise IntegrityError(f"no group invoice number free for group {group.pk} in {ISSUE_ATTEMPTS} attempts")


def _issue_once(billed: BilledGroup, month: date, own: list[tuple[User, Invoice]]) -> GroupInvoice | None:
    number = invoices.next_number(GroupInvoice)
    existing = GroupInvoice.objects.filter(group=billed.group, month=month).first()
    if existing is not None or not own:
        return existing
    issued = GroupInvoice.objects.create(
        number=number,
        group=billed.group,
        month=month,
        billing_name=billed.billing_name,
        billing_email=billed.billing_email,
        currency=settings.CURRENCY,
        minutes=sum(found.minutes for _, found in own),
        total=sum((found.total for _, found in own), Decimal(0)),
        credit_applied=sum((found.credit_applied for _, found in own), Decimal(0)),
        balance_due=sum((found.balance_due for _, found in own), Decimal(0)),
    )
    also = _other_billed_groups(billed.group, [member for member, _ in own])
    GroupInvoiceMember.objects.bulk_create(
        GroupInvoiceMember(
            group_invoice=issued,
            member=member,
            invoice=found,
            minutes=found.minutes,
            total=found.total,
            credit_applied=found.credit_applied,
            balance_due=found.balance_due,
            also_billed_to=", ".join(also[member.pk])[:500],
        )
        for member, found in own
    )
    return issued


def _other_billed_groups(group: Group, members: list[User]) -> dict[int, list[str]]:
    rows = (
        Group.objects.filter(billed__isnull=False, user__in=members)
        .exclude(pk=group.pk)
        .order_by("name")
        .values_list("user", "name")
    )
    found: dict[int, list[str]] = defaultdict(list)
    for user_id, name in rows:
        found[user_id].append(name)
    return found


def issue_month(month: date) -> list[GroupInvoice]:
    """Issue the month's invoice of every billed group with a member charged in it; those already issued
    stay as they are."""
    invoices.month_over(month)
    issued = [issue(billed.group, month) for billed in BilledGroup.objects.select_related("group")]
    return [found for found in issued if found is not None]


# Who sees them


def may_see(user: User | AnonymousUser, group_invoice: GroupInvoice) -> bool:
    if is_operator(user):
        return True
    return bool(
        user.is_authenticated and user.has_perm(PERMISSION) and user.groups.filter(pk=group_invoice.group_id).exists()
    )


def group_invoice_for(user: User | AnonymousUser, number: int) -> GroupInvoice:
    """A group invoice the person may see; anyone else's answers exactly like one that does not exist."""
    found = GroupInvoice.objects.filter(number=number).select_related("group").first()
    if found is None or not may_see(user, found):
        raise Http404("No such group invoice among yours.")
    return found


def of_my_groups(user: User) -> QuerySet[GroupInvoice]:
    """The invoices of the billed groups someone is in, if they may see them (their billing page lists them)."""
    if not (is_operator(user) or user.has_perm(PERMISSION)):
        return GroupInvoice.objects.none()
    return GroupInvoice.objects.filter(group__in=user.groups.all()).select_related("group")


# What a page and a CSV show


@dataclass(frozen=True)
class Shown:
    line: InvoiceLine
    amount: str


@dataclass(frozen=True)
class MemberShown:
    row: GroupInvoiceMember
    lines: list[Shown]
    total: str
    credit_applied: str
    balance_due: str
    note: CreditNote | None


def members_of(group_invoice: GroupInvoice) -> list[MemberShown]:
    """Each member with their invoice's lines and any credit note that reversed it: three queries."""
    rows = list(group_invoice.members.select_related("member", "invoice"))
    lines: dict[int, list[InvoiceLine]] = defaultdict(list)
    for line in InvoiceLine.objects.filter(invoice__in=[row.invoice_id for row in rows]).order_by("started", "id"):
        lines[line.invoice_id].append(line)
    notes = {note.invoice_id: note for note in CreditNote.objects.filter(invoice__in=[row.invoice_id for row in rows])}
    return [
        MemberShown(
            row=row,
            lines=[Shown(line, money.shown(line.amount)) for line in lines[row.invoice_id]],
            total=money.shown(row.total),
            credit_applied=money.shown(row.credit_applied),
            balance_due=money.shown(row.balance_due),
            note=notes.get(row.invoice_id),
        )
        for row in rows
    ]


def write_csv(group_invoice: GroupInvoice, out: HttpResponse) -> None:
    """Every member's lines with exact amounts (six decimals, as charged), each member's totals, the totals."""
    writer = csv.writer(out)
    writer.writerow(
        ["group invoice", group_invoice.label, "group", group_invoice.group.name,
         "month", f"{group_invoice.month:%Y-%m}", "currency", group_invoice.currency]
    )  # fmt: skip
    writer.writerow(["billed to", group_invoice.billing_name, group_invoice.billing_email])
    members = members_of(group_invoice)
    writer.writerow(
        ["member", "invoice", "usage", "GPU", "kind", "profile", "market", "started", "ended",
         "first minute", "minutes", "rate per minute", "amount"]
    )  # fmt: skip
    for shown in members:
        for line in (item.line for item in shown.lines):
            writer.writerow(
                [shown.row.member.get_username(), shown.row.invoice.label, line.usage_id, line.gpu_model, line.kind,
                 line.profile, line.market, line.started.isoformat(), line.ended.isoformat() if line.ended else "",
                 line.first_minute, line.minutes, line.per_minute, line.amount]
            )  # fmt: skip
    writer.writerow(["member", "invoice", "minutes", "total", "credit applied", "balance due", "also billed to"])
    for shown in members:
        row = shown.row
        writer.writerow(
            [row.member.get_username(), row.invoice.label, row.minutes, row.total, row.credit_applied,
             row.balance_due, row.also_billed_to]
        )  # fmt: skip
    for label, value in [
        ("minutes", group_invoice.minutes),
        ("total", group_invoice.total),
        ("credit applied", group_invoice.credit_applied),
        ("balance due", group_invoice.balance_due),
    ]:
        writer.writerow([label, value])
    for shown in members:
        if shown.note is not None:
            note = shown.note
            writer.writerow(
                ["credit note", note.label, "reverses", shown.row.invoice.label, note.issued_at.isoformat(),
                 -note.amount, note.reason]
            )  # fmt: skip
