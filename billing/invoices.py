"""Monthly invoices: one per person per calendar month (UTC), read from what the meter charged.

An invoice lists, per usage, its charged minutes that no earlier invoice listed and that began before the
end of the month: its own month's, and any of an earlier month that were charged after that month's
invoice (late: a holding confirmed again after an outage). A usage charged past its end after an invoice
listed those minutes has them given back (a settlement) and the next invoice takes them off with a line
of negative minutes. Minutes are counted from the usage's charged rows (contiguous from its first minute,
also once folded into days), at its frozen per-minute rate: never recomputed from prices. Months are issued
in order, each person's opening balance is the closing balance of their invoices before (so a minute is
never applied twice), and credit is everything added to the wallet that is not a charge: grants, top-ups,
credit notes, reversals. Issued invoices are never changed; a credit note reverses one in full and gives
its amount back to the wallet. Also the pages: a person's invoice (print-ready HTML, which the browser
prints to PDF), its CSV, staff's credit note. Only the owner and staff see an invoice; anyone else gets 404.
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
from django.db.models import F, Max, Q, Sum
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from billing import ledger, money
from billing.models import (
    Account,
    CreditNote,
    Entry,
    GroupInvoice,
    Invoice,
    InvoiceLine,
    LedgerTransaction,
    Usage,
)
from portal.access import staff_required
from portal.clock import database_now
from portal.http import PortalRequest
from portal.roles import is_operator

MINUTE = timedelta(minutes=1)
NUMBER_LOCK = 0x696E_766F_6963_6573  # "invoices": numbers are handed out one at a time
ISSUE_ATTEMPTS = 3
CREDIT_APPLIED = (
    "The opening balance is the wallet at the start of the month after every earlier invoice; credit added is "
    "what was added during it (grants, top-ups, credit notes). Credit applied is the part of this month's "
    "charges that credit covered, once any balance carried in below zero is paid: the opening balance plus the "
    "credit added (and any minutes given back), at most the charges. Balance due is the rest, what the wallet "
    "went below zero. A line with negative minutes gives back minutes an earlier invoice listed, charged past "
    "the end of their holding; a line that began before this month lists minutes charged after its invoice."
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

CHARGES = [LedgerTransaction.Kind.USAGE, LedgerTransaction.Kind.SETTLEMENT]  # row-backed: listed as lines


def _ceil_minutes(span: timedelta) -> int:
    return -(-span // MINUTE)


def begun_before(usage: Usage, moment: datetime) -> int:
    """How many of a usage's minutes began before ``moment``."""
    return max(0, _ceil_minutes(moment - usage.started))


def _lines(user: User, until: datetime) -> list[InvoiceLine]:
    """Each usage's charged minutes begun before ``until`` that no issued invoice lists yet, and the minutes
    invoices listed that were given back since; the usages are locked until the invoice is written."""
    usages = (
        Usage.objects.select_for_update(of=("self",))
        .filter(owner=user, started__lt=until)
        .exclude(billed_minutes=F("invoiced_minutes"))
        .select_related("slice__gpu")
        .order_by("started", "id")
    )
    lines = []
    for usage in usages:
        upto = min(usage.billed_minutes, begun_before(usage, until))
        if upto == usage.invoiced_minutes:
            continue
        minutes = upto - usage.invoiced_minutes
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
                first_minute=min(upto, usage.invoiced_minutes),
                minutes=minutes,
                per_minute=usage.per_minute,
                amount=usage.per_minute * minutes,
            )
        )
    return lines


def _wallet_sum(entries: Q) -> Decimal:
    return money.exact(
        Entry.objects.filter(entries, account__kind=Account.Kind.WALLET).aggregate(total=Sum("amount"))["total"]
    )


def credit_posted(user: User, until: datetime, since: datetime | None = None) -> Decimal:
    """What was added to the wallet before ``until`` (from ``since``) that is not a charge: grants, top-ups,
    credit notes, reversals (and what reversed those)."""
    posted = Q(account__user=user, transaction__posted_at__lt=until) & ~Q(transaction__kind__in=CHARGES)
    if since is not None:
        posted &= Q(transaction__posted_at__gte=since)
    return _wallet_sum(posted)


def _credit(user: User, since: datetime, until: datetime, lines: list[InvoiceLine]) -> dict[str, Decimal]:
    """The month's money: the opening balance is what the credit before the month leaves after every earlier
    invoice (their closing balance), credit added is the month's, and credit covers the charges once any debt
    carried in is paid (minutes given back count as credit here, never as a charge)."""
    earlier = Invoice.objects.filter(user=user, month__lt=since.date()).aggregate(total=Sum("total"))["total"]
    opening = credit_posted(user, since) - money.exact(earlier)
    added = credit_posted(user, until, since=since)
    charges = sum((line.amount for line in lines if line.amount > 0), Decimal(0))
    given_back = -sum((line.amount for line in lines if line.amount < 0), Decimal(0))
    applied = min(charges, max(Decimal(0), opening + added + given_back))
    return {
        "opening_balance": opening,
        "credit_added": added,
        "credit_applied": applied,
        "balance_due": charges - applied,
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
    """Issue a person's invoice for a month that has ended (and first those of earlier months that minutes
    not invoiced yet began in, so months are issued in order); the one already issued if there is one, None
    if nothing was charged for the month."""
    month = month.replace(day=1)
    since, until = month_over(month)
    for earlier in _months_owed(user, since):
        issue(user, earlier)
    for _attempt in range(ISSUE_ATTEMPTS):
        try:
            with transaction.atomic():
                return _issue_once(user, month, since, until)
        except IntegrityError:  # SQLite, which takes no lock: another process took this number or this month
            found = Invoice.objects.filter(user=user, month=month).first()
            if found is not None:
                return found
    raise IntegrityError(f"no invoice number free for user {user.pk} in {ISSUE_ATTEMPTS} attempts")


def _months_owed(user: User, since: datetime) -> list[date]:
    """The months before ``since``, without an invoice yet, from the one its oldest minute not invoiced began in."""
    owing = Usage.objects.filter(owner=user, started__lt=since, billed_minutes__gt=F("invoiced_minutes"))
    oldest = min(
        (u.started + u.invoiced_minutes * MINUTE for u in owing.only("started", "invoiced_minutes")), default=None
    )
    if oldest is None or oldest >= since:
        return []
    months, month = [], month_of(oldest)
    while month < since.date():
        months.append(month)
        month = (month + timedelta(days=32)).replace(day=1)
    issued = set(Invoice.objects.filter(user=user, month__in=months).values_list("month", flat=True))
    return [month for month in months if month not in issued]


def month_of(moment: datetime) -> date:
    return moment.astimezone(UTC).date().replace(day=1)


def _issue_once(user: User, month: date, since: datetime, until: datetime) -> Invoice | None:
    number = next_number(Invoice)
    existing = Invoice.objects.filter(user=user, month=month).first()
    if existing is not None:
        return existing
    lines = _lines(user, until)
    if not lines:
        return None
    invoice = Invoice.objects.create(
        number=number,
        user=user,
        month=month,
        currency=settings.CURRENCY,
        minutes=sum(line.minutes for line in lines),
        total=sum((line.amount for line in lines), Decimal(0)),
        **_credit(user, since, until, lines),
    )
    for line in lines:
        line.invoice = invoice
        Usage.objects.filter(pk=line.usage_id).update(invoiced_minutes=F("invoiced_minutes") + line.minutes)
    InvoiceLine.objects.bulk_create(lines)
    return invoice


def issue_month(month: date) -> list[Invoice]:
    """Issue the month's invoice of everyone with charged minutes not invoiced yet that began before its end (or
    minutes given back since); those already issued stay as they are (and are returned with the new ones)."""
    _since, until = month_over(month)
    owing = Usage.objects.filter(started__lt=until).exclude(billed_minutes=F("invoiced_minutes"))
    owners = set(owing.values_list("owner_id", flat=True).distinct())
    owners |= set(Invoice.objects.filter(month=month).values_list("user_id", flat=True))
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
