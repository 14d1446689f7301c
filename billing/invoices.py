"""Monthly invoices: one per person per calendar month (UTC), read from what the meter charged.

A line is one usage's minutes that began in the month (a usage across midnight of the 1st is split by
minute index), counted from its charged minute rows, or from its daily rows once they are folded
(billing/rollup.py), at its frozen per-minute rate: never recomputed from prices. Issued invoices are
never changed; a credit note reverses one in full and gives its amount back to the wallet. Also the
pages: a person's invoice (print-ready HTML, which the browser prints to PDF), its CSV, staff's credit
note. Only the owner and staff see an invoice; anyone else gets 404.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Max, Min, Q, Sum
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from billing import ledger, money
from billing.models import (
    Account,
    ChargedMinute,
    CreditNote,
    Entry,
    GroupInvoice,
    Invoice,
    InvoiceLine,
    LedgerTransaction,
    Usage,
)
from billing.prices import database_now
from portal.access import staff_required
from portal.http import PortalRequest
from portal.roles import is_operator

MINUTE = timedelta(minutes=1)
NUMBER_LOCK = 0x696E_766F_6963_6573  # "invoices": numbers are handed out one at a time
ISSUE_ATTEMPTS = 3
CREDIT_KINDS = [LedgerTransaction.Kind.GRANT, LedgerTransaction.Kind.TOP_UP]
CREDIT_APPLIED = (
    "Credit applied is the part of this month's charges that prepaid credit covered: the wallet's balance at "
    "the start of the month (if above zero) plus the grants and top-ups added during it, at most the total. "
    "Balance due is the rest, what the wallet went below zero."
)
PAGE = "billing/invoice.html"
LIST = "billing/invoice_list.html"


# Months


def month_bounds(month: date) -> tuple[datetime, datetime]:
    """The first moment of a (UTC) month and of the next one."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    return start, datetime(month.year + month.month // 12, month.month % 12 + 1, 1, tzinfo=UTC)


def last_month(now: datetime | None = None) -> date:
    """The calendar month (UTC) before the one the database's clock is in."""
    first = (now or database_now()).astimezone(UTC).date().replace(day=1)
    return (first - timedelta(days=1)).replace(day=1)


# Reading what was charged


def _ceil_minutes(span: timedelta) -> int:
    return -(-span // MINUTE)


def charged_in(usage: Usage, since: datetime, until: datetime) -> tuple[int, int]:
    """The first minute index and the number of a usage's charged minutes that began in [since, until)."""
    low = max(0, _ceil_minutes(since - usage.started))
    high = min(usage.billed_minutes, max(0, _ceil_minutes(until - usage.started)))
    if high <= low:
        return low, 0
    if usage.folded:
        days = usage.days.filter(day__gte=since.date(), day__lt=until.date())
        found = days.aggregate(first=Min("first_minute"), count=Sum("minutes"))
    else:
        rows = ChargedMinute.objects.filter(usage=usage, minute__gte=low, minute__lt=high)
        found = rows.aggregate(first=Min("minute"), count=Count("pk"))
    return found["first"] or low, int(found["count"] or 0)


def _lines(user: User, since: datetime, until: datetime) -> list[InvoiceLine]:
    usages = (
        Usage.objects.filter(owner=user, started__lt=until, billed_minutes__gt=0)
        .exclude(ended__lt=since)
        .select_related("slice__gpu")
        .order_by("started", "id")
    )
    lines = []
    for usage in usages:
        first, minutes = charged_in(usage, since, until)
        if minutes:
            lines.append(
                InvoiceLine(
                    usage=usage,
                    holder_kind=usage.holder_kind,
                    holder_id=usage.holder_id,
                    gpu_model=usage.slice.gpu.model_name,
                    kind=usage.slice.kind,
                    profile=usage.slice.profile,
                    market=usage.market,
                    started=usage.started,
                    ended=usage.ended,
                    first_minute=first,
                    minutes=minutes,
                    per_minute=usage.per_minute,
                    amount=usage.per_minute * minutes,
                )
            )
    return lines


def _wallet_sum(entries: Q) -> Decimal:
    total = Entry.objects.filter(entries, account__kind=Account.Kind.WALLET).aggregate(total=Sum("amount"))["total"]
    return total if total is not None else Decimal(0)


def _credit(user: User, since: datetime, until: datetime, total: Decimal) -> dict[str, Decimal]:
    opening = _wallet_sum(Q(account__user=user, transaction__posted_at__lt=since))
    in_month = Q(account__user=user, transaction__posted_at__gte=since, transaction__posted_at__lt=until)
    added = _wallet_sum(
        in_month
        & (
            Q(transaction__kind__in=CREDIT_KINDS)
            | Q(transaction__kind=LedgerTransaction.Kind.REVERSAL, transaction__reverses__kind__in=CREDIT_KINDS)
        )
    )
    applied = min(total, max(Decimal(0), max(opening, Decimal(0)) + added))
    return {
        "opening_balance": opening,
        "credit_added": added,
        "credit_applied": applied,
        "balance_due": total - applied,
    }


# Issuing


def next_number(model: type[Invoice] | type[CreditNote] | type[GroupInvoice]) -> int:
    """The next number of a series of issued documents; on PostgreSQL, one issuer at a time takes one."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [NUMBER_LOCK])
    return int(model.objects.aggregate(top=Max("number"))["top"] or 0) + 1


def month_over(month: date) -> tuple[datetime, datetime]:
    """The bounds of a month that has ended by the database's clock; refused if it has not."""
    since, until = month_bounds(month)
    if until > database_now():
        raise ValidationError(f"{month:%B %Y} has not ended yet.", code="month_not_over")
    return since, until


def issue(user: User, month: date) -> Invoice | None:
    """Issue a person's invoice for a month that has ended; the one already issued if there is one, None if
    nothing was charged for the month."""
    month = month.replace(day=1)
    since, until = month_over(month)
    for _attempt in range(ISSUE_ATTEMPTS):
        try:
            with transaction.atomic():
                return _issue_once(user, month, since, until)
        except IntegrityError:  # SQLite, which takes no lock: another process took this number or this month
            found = Invoice.objects.filter(user=user, month=month).first()
            if found is not None:
                return found
    raise IntegrityError(f"no invoice number free for user {user.pk} in {ISSUE_ATTEMPTS} attempts")


def _issue_once(user: User, month: date, since: datetime, until: datetime) -> Invoice | None:
    number = next_number(Invoice)
    existing = Invoice.objects.filter(user=user, month=month).first()
    if existing is not None:
        return existing
    lines = _lines(user, since, until)
    if not lines:
        return None
    total = sum((line.amount for line in lines), Decimal(0))
    invoice = Invoice.objects.create(
        number=number,
        user=user,
        month=month,
        currency=settings.CURRENCY,
        minutes=sum(line.minutes for line in lines),
        total=total,
        **_credit(user, since, until, total),
    )
    for line in lines:
        line.invoice = invoice
    InvoiceLine.objects.bulk_create(lines)
    return invoice


def issue_month(month: date) -> list[Invoice]:
    """Issue the month's invoice of everyone who was charged for it; those already issued stay as they are."""
    since, until = month_over(month)
    owners = (
        Usage.objects.filter(started__lt=until, billed_minutes__gt=0)
        .exclude(ended__lt=since)
        .values_list("owner_id", flat=True)
        .distinct()
    )
    issued = [issue(user, month) for user in User.objects.filter(pk__in=owners).order_by("pk")]
    return [invoice for invoice in issued if invoice is not None]


def credit_note(invoice: Invoice, by: User, reason: str) -> CreditNote:
    """Staff reverse an issued invoice in full: its amount back to the wallet, from the revenue it went to."""
    if not is_operator(by):
        raise PermissionDenied("Only staff issue credit notes.")
    if not reason.strip():
        raise ValidationError("Say why the invoice is reversed.", code="no_reason")
    by_market: dict[str, Decimal] = defaultdict(Decimal)
    for line in invoice.lines.all():
        by_market[line.market] += line.amount
    with transaction.atomic():
        number = next_number(CreditNote)
        if CreditNote.objects.filter(invoice=invoice).exists():
            raise ValidationError(f"{invoice.label} was already reversed.", code="already_reversed")
        posting = [(ledger.wallet(invoice.user), invoice.total)]
        posting += [(ledger.portal_account(f"revenue_{market}"), -amount) for market, amount in by_market.items()]
        memo = f"credit note for {invoice.label}: {reason.strip()}"
        posted = ledger.post(LedgerTransaction.Kind.REVERSAL, posting, memo=memo, user=invoice.user, by=by)
        return CreditNote.objects.create(
            number=number,
            invoice=invoice,
            amount=invoice.total,
            reason=reason.strip()[:300],
            created_by=by,
            transaction=posted,
        )


# Pages


@dataclass(frozen=True)
class Shown:
    line: InvoiceLine
    amount: str


def invoice_for(user: User | AnonymousUser, number: int) -> Invoice:
    """An invoice its owner or staff may see; anyone else's answers exactly like one that does not exist."""
    found = Invoice.objects.filter(number=number).select_related("user").first()
    if found is None or not (found.user_id == user.pk or is_operator(user)):
        raise Http404("No such invoice among yours.")
    return found


def list_context(user: User) -> dict[str, object]:
    invoices = Invoice.objects.filter(user=user).select_related("credit_note")
    return {"invoices": [(invoice, money.shown(invoice.total)) for invoice in invoices]}


@login_required
@require_GET
def invoice_page(request: PortalRequest, number: int) -> HttpResponse:
    invoice = invoice_for(request.user, number)
    note = CreditNote.objects.filter(invoice=invoice).select_related("created_by").first()
    context = {
        "invoice": invoice,
        "lines": [Shown(line, money.shown(line.amount)) for line in invoice.lines.all()],
        "shown": {
            field: money.shown(getattr(invoice, field))
            for field in ("total", "opening_balance", "credit_added", "credit_applied", "balance_due")
        },
        "credit_applied_means": CREDIT_APPLIED,
        "note": note,
        "note_amount": money.shown(note.amount) if note else "",
        "can_reverse": note is None and is_operator(request.user),
    }
    return render(request, PAGE, context)


@login_required
@require_GET
def invoice_csv(request: PortalRequest, number: int) -> HttpResponse:
    invoice = invoice_for(request.user, number)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{invoice.label}-{invoice.month:%Y-%m}.csv"'
    write_csv(invoice, response)
    return response


def write_csv(invoice: Invoice, out: HttpResponse) -> None:
    """The lines with exact amounts (six decimals, as charged), then the totals."""
    writer = csv.writer(out)
    writer.writerow(["invoice", invoice.label, "month", f"{invoice.month:%Y-%m}", "currency", invoice.currency])
    writer.writerow(
        ["usage", "holder", "holder id", "GPU", "kind", "profile", "market", "started", "ended",
         "first minute", "minutes", "rate per minute", "amount"]
    )  # fmt: skip
    for line in invoice.lines.all():
        writer.writerow(
            [line.usage_id, line.holder_kind, line.holder_id, line.gpu_model, line.kind, line.profile, line.market,
             line.started.isoformat(), line.ended.isoformat() if line.ended else "", line.first_minute,
             line.minutes, line.per_minute, line.amount]
        )  # fmt: skip
    for label, value in [
        ("minutes", invoice.minutes),
        ("total", invoice.total),
        ("opening balance", invoice.opening_balance),
        ("credit added", invoice.credit_added),
        ("credit applied", invoice.credit_applied),
        ("balance due", invoice.balance_due),
    ]:
        writer.writerow([label, value])
    note = CreditNote.objects.filter(invoice=invoice).first()
    if note is not None:
        writer.writerow(["reversed by credit note", note.label, note.issued_at.isoformat(), -note.amount, note.reason])


@staff_required
@require_POST
def reverse_invoice(request: PortalRequest, number: int) -> HttpResponse:
    """Staff: a credit note that reverses the invoice in full, with a reason."""
    invoice = invoice_for(request.user, number)
    assert isinstance(request.user, User)
    try:
        note = credit_note(invoice, by=request.user, reason=request.POST.get("reason", ""))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(
            request, f"{note.label} reverses {invoice.label}: {money.shown(note.amount)} back to the wallet."
        )
    return redirect("billing-invoice", number=invoice.number)
