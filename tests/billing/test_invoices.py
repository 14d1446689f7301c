"""Monthly invoices over minutes the real meter charged: a usage across midnight of the 1st split by minute
index, amounts equal to the ledger's charges, issued once and never changed (a credit note reverses),
seen only by their owner and staff, as a page and a CSV; beat's task and the command issue last month's.

The clock is controlled the way the meter's tests do it: holdings are recorded at moments in the past.
"""

from __future__ import annotations

import csv
import io
import threading
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from celery.schedules import crontab
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import CommandError, call_command
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Sum
from django.test import Client
from django.urls import reverse

from billing import invoices, ledger, meter, rollup
from billing.models import Account, CreditNote, Entry, Invoice, InvoiceLine, LedgerTransaction
from billing.tasks import issue_invoices
from portal.celery import app
from portal.clock import database_now
from tests.billing.conftest import H200_3G, Hold, ledger_total, unbalanced_transactions

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="PostgreSQL only (its triggers, its advisory lock)"
)
A100_MINUTE = Decimal("0.141667")


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def months() -> tuple[datetime, datetime]:
    """The first moments of last month and of the month before it (both over, whenever the test runs)."""
    last = invoices.last_month()
    return invoices.month_bounds(last)[0], invoices.month_bounds(invoices.last_month(invoices.month_bounds(last)[0]))[0]


def held_at(hold: Hold, owner: User, start: datetime, lasted: timedelta, **kwargs: object) -> None:
    hold(owner, database_now() - start, lasted=lasted, **kwargs)


def credit_posted_at(user: User, amount: str, moment: datetime) -> None:
    """A grant as the ledger would have posted it at ``moment`` (the ledger's rows are never moved later)."""
    posted = LedgerTransaction.objects.create(kind=LedgerTransaction.Kind.GRANT, posted_at=moment, user=user, memo="t")
    source = ledger.portal_account(Account.Kind.PROMOTIONAL)
    Entry.objects.bulk_create(
        [
            Entry(transaction=posted, account=source, amount=-Decimal(amount)),
            Entry(transaction=posted, account=ledger.wallet(user), amount=Decimal(amount)),
        ]
    )


@pytest.fixture
def charged(hold: Hold, alice: User) -> tuple[datetime, datetime]:
    """Alice's A100 from 10 min 30 s before last month began, for 25 minutes (minutes 0-10 in the month
    before, 11-24 in last month), and a MIG slice for 7 min 5 s (8 minutes) mid last month; the meter
    charges both."""
    last, before = months()
    held_at(hold, alice, last - timedelta(minutes=10, seconds=30), timedelta(minutes=25))
    held_at(hold, alice, last + timedelta(days=3, hours=4), timedelta(minutes=7, seconds=5), request=H200_3G)
    assert meter.tick().minutes == 25 + 8
    return last, before


def usage_charges(user: User) -> Decimal:
    """What the ledger took from the person's wallet for usage, all of it."""
    found = Entry.objects.filter(
        account__kind=Account.Kind.WALLET, account__user=user, transaction__kind=LedgerTransaction.Kind.USAGE
    ).aggregate(total=Sum("amount"))["total"]
    return -Decimal(found)


def test_a_usage_across_the_first_of_the_month_is_split_by_minute_index(
    charged: tuple[datetime, datetime], alice: User
) -> None:
    last, before = charged
    earlier = invoices.issue(alice, before.date())
    later = invoices.issue(alice, last.date())
    assert earlier is not None and later is not None
    (one,) = earlier.lines.all()
    assert (one.gpu_model, one.kind, one.first_minute, one.minutes) == ("A100-SXM4-80GB", "whole", 0, 11)
    assert one.per_minute == A100_MINUTE and one.amount == 11 * A100_MINUTE
    rest, mig = later.lines.all()
    assert (rest.usage_id, rest.first_minute, rest.minutes) == (one.usage_id, 11, 14)
    assert (mig.kind, mig.profile, mig.minutes, mig.market) == ("mig", "3g.71gb", 8, "on_demand")
    assert mig.amount == 8 * mig.usage.per_minute
    assert (earlier.minutes, later.minutes) == (11, 22)
    assert earlier.total == one.amount and later.total == rest.amount + mig.amount
    assert earlier.total + later.total == usage_charges(alice) == -ledger.balance(alice)
    assert later.number == earlier.number + 1 and later.label == f"INV-{later.number:06d}"


def test_folded_minutes_invoice_the_same_as_minute_rows(charged: tuple[datetime, datetime], alice: User) -> None:
    last, before = charged
    assert rollup.roll_up(older_than=timedelta(0)).minutes == 33
    earlier, later = invoices.issue(alice, before.date()), invoices.issue(alice, last.date())
    assert earlier is not None and later is not None
    assert [(line.first_minute, line.minutes) for line in later.lines.all()] == [(11, 14), (0, 8)]
    assert earlier.minutes == 11 and earlier.total + later.total == usage_charges(alice)


def test_issuing_twice_is_a_no_op(charged: tuple[datetime, datetime], alice: User) -> None:
    last, _ = charged
    first = invoices.issue(alice, last.date())
    again = invoices.issue(alice, last.date())
    assert first is not None and again is not None and again.pk == first.pk
    assert [invoice.pk for invoice in invoices.issue_month(last.date())] == [first.pk]
    # the month before, whose minutes began first, was issued before it (months are issued in order)
    assert Invoice.objects.count() == 2 and InvoiceLine.objects.count() == 3


def test_a_month_not_over_is_not_invoiced_and_a_month_without_charges_gets_none(hold: Hold, alice: User) -> None:
    with pytest.raises(ValidationError, match="has not ended"):
        invoices.issue(alice, database_now().date())
    assert invoices.issue(alice, invoices.last_month()) is None and Invoice.objects.count() == 0


def test_credit_is_applied_once_whenever_the_charges_were_posted(
    charged: tuple[datetime, datetime], alice: User
) -> None:
    """Every minute here was posted when the meter ran (now), after both months: last month opens with what the
    month before left (its closing balance), never with the 0.50 the month before already applied."""
    last, before = charged
    credit_posted_at(alice, "0.50", before - timedelta(days=2))
    credit_posted_at(alice, "2.00", last + timedelta(days=1))
    earlier, later = invoices.issue(alice, before.date()), invoices.issue(alice, last.date())
    assert earlier is not None and later is not None
    assert (earlier.opening_balance, earlier.credit_added, earlier.credit_applied) == (
        Decimal("0.5"),
        Decimal(0),
        Decimal("0.5"),
    )
    assert earlier.balance_due == earlier.total - Decimal("0.5")
    closing = earlier.opening_balance + earlier.credit_added - earlier.total
    assert later.opening_balance == closing == Decimal("0.5") - 11 * A100_MINUTE
    # The 2.00 of last month first pays what the month before left below zero; the rest covers last month.
    assert (later.credit_added, later.credit_applied) == (Decimal(2), closing + 2)
    assert later.balance_due == later.total - later.credit_applied
    assert later.opening_balance + later.credit_added - later.total == ledger.balance(alice)


def test_an_issued_invoice_refuses_changes_in_python(charged: tuple[datetime, datetime], alice: User) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    invoice.total = Decimal(0)
    with pytest.raises(ValidationError, match="never changed"):
        invoice.save()
    with pytest.raises(ValidationError, match="never deleted"):
        invoice.lines.first().delete()  # type: ignore[union-attr]


@postgresql_only
def test_postgresql_refuses_editing_or_deleting_an_issued_invoice(
    charged: tuple[datetime, datetime], alice: User
) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    for attempt in (
        lambda: Invoice.objects.filter(pk=invoice.pk).update(total=0),
        lambda: InvoiceLine.objects.filter(invoice=invoice).update(minutes=1),
        lambda: InvoiceLine.objects.filter(invoice=invoice)._raw_delete(connection.alias),
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            attempt()
    assert Invoice.objects.get(pk=invoice.pk).total == invoice.total and invoice.lines.count() == 2


def test_a_credit_note_reverses_an_invoice_in_full(
    charged: tuple[datetime, datetime], alice: User, bob: User, staff: User
) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    before = ledger.balance(alice)
    with pytest.raises(PermissionDenied):
        invoices.credit_note(invoice, by=bob, reason="please")
    with pytest.raises(ValidationError, match="Say why"):
        invoices.credit_note(invoice, by=staff, reason=" ")
    note = invoices.credit_note(invoice, by=staff, reason="GPU faulty that day")
    assert note.amount == invoice.total and note.label == f"CN-{note.number:06d}"
    assert ledger.balance(alice) == before + invoice.total
    assert ledger.account_balance(Account.Kind.REVENUE_ON_DEMAND) == usage_charges(alice) - invoice.total
    assert ledger_total() == 0 and unbalanced_transactions() == []
    with pytest.raises(ValidationError, match="already reversed"):
        invoices.credit_note(invoice, by=staff, reason="again")
    assert CreditNote.objects.count() == 1 and Invoice.objects.get(pk=invoice.pk).total == invoice.total


def test_only_the_owner_and_staff_see_an_invoice(
    charged: tuple[datetime, datetime], alice: User, bob: User, staff: User
) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    page, csv_url = (reverse(name, args=[invoice.number]) for name in ("billing-invoice", "billing-invoice-csv"))
    for url in (page, csv_url):
        assert client_of(bob).get(url).status_code == 404
        assert client_of(alice).get(url).status_code == 200
        assert client_of(staff).get(url).status_code == 200
    assert client_of(bob).get(reverse("billing-invoice", args=[invoice.number + 99])).status_code == 404
    assert (
        client_of(alice).post(reverse("billing-invoice-reverse", args=[invoice.number]), {"reason": "x"}).status_code
        == 403
    )
    assert Client().get(page).status_code == 302


def test_the_page_lists_lines_totals_and_what_credit_applied_means(
    charged: tuple[datetime, datetime], alice: User
) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    html = client_of(alice).get(reverse("billing-invoice", args=[invoice.number])).content.decode()
    assert invoice.label in html and "A100-SXM4-80GB" in html and "3g.71gb" in html and "(from minute 11)" in html
    assert f"{invoice.total.quantize(Decimal('0.01'))} CNY" in html and "Credit applied is the part" in html
    assert 'media="print"' in html and "/static/css/invoice-print." in html
    listing = client_of(alice).get(reverse("billing-account")).content.decode()
    assert invoice.label in listing and reverse("billing-invoice-csv", args=[invoice.number]) in listing


def test_the_csv_has_every_line_with_exact_amounts_and_the_totals(
    charged: tuple[datetime, datetime], alice: User
) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    response = client_of(alice).get(reverse("billing-invoice-csv", args=[invoice.number]))
    assert response["Content-Type"].startswith("text/csv")
    assert f'filename="{invoice.label}-{invoice.month:%Y-%m}.csv"' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["invoice", invoice.label, "month", f"{invoice.month:%Y-%m}", "currency", "CNY"]
    assert rows[1][9:] == ["first minute", "minutes", "rate per minute", "amount"]
    mig = invoice.lines.get(kind="mig")
    assert [row[3:7] + row[9:] for row in rows[2:4]] == [
        ["A100-SXM4-80GB", "whole", "", "on_demand", "11", "14", "0.141667", "1.983338"],
        [mig.gpu_model, "mig", "3g.71gb", "on_demand", "0", "8", str(mig.per_minute), str(mig.amount)],
    ]
    assert dict(row for row in rows[4:] if len(row) == 2)["total"] == str(invoice.total)
    assert rows[-1][0] == "balance due"


def test_the_csv_of_a_reversed_invoice_ends_with_its_credit_note(
    charged: tuple[datetime, datetime], alice: User, staff: User
) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    note = invoices.credit_note(invoice, by=staff, reason="GPU faulty")
    rows = list(
        csv.reader(
            io.StringIO(client_of(alice).get(reverse("billing-invoice-csv", args=[invoice.number])).content.decode())
        )
    )
    assert rows[-1] == [
        "reversed by credit note",
        note.label,
        note.issued_at.isoformat(),
        str(-note.amount),
        "GPU faulty",
    ]


def test_the_invoice_page_reads_a_fixed_number_of_queries_however_many_lines(
    hold: Hold, alice: User, django_assert_max_num_queries: Any
) -> None:
    last, _ = months()
    for day in range(1, 7):
        held_at(hold, alice, last + timedelta(days=day), timedelta(minutes=2))
    meter.tick()
    invoice = invoices.issue(alice, last.date())
    assert invoice is not None and invoice.lines.count() == 6
    client = client_of(alice)
    with django_assert_max_num_queries(8):
        assert client.get(reverse("billing-invoice", args=[invoice.number])).status_code == 200


def test_the_task_issues_last_months_invoices_and_a_rerun_changes_nothing(
    charged: tuple[datetime, datetime], alice: User, bob: User, hold: Hold
) -> None:
    last, _ = charged
    held_at(hold, bob, last + timedelta(days=9), timedelta(minutes=2))  # charged by the task's own tick
    result = issue_invoices.apply().get()
    assert result["month"] == f"{last:%Y-%m}" and len(result["invoices"]) == 2
    issued = Invoice.objects.filter(month=last.date())
    assert {invoice.user_id: invoice.minutes for invoice in issued} == {alice.pk: 22, bob.pk: 2}
    # alice's month before, whose minutes began first, was issued before hers of last month
    assert issue_invoices.apply().get()["invoices"] == result["invoices"] and Invoice.objects.count() == 3


def test_beat_issues_invoices_on_the_first_of_the_month() -> None:
    entry = app.conf.beat_schedule["billing-invoices"]
    assert entry["task"] == issue_invoices.name and isinstance(entry["schedule"], crontab)
    assert entry["schedule"].day_of_month == {1} and entry["schedule"].hour == {0}


def test_the_command_issues_a_named_month_for_operators_catching_up(
    charged: tuple[datetime, datetime], alice: User
) -> None:
    _, before = charged
    out = io.StringIO()
    call_command("issue_invoices", month=f"{before:%Y-%m}", stdout=out)
    assert f"{before:%Y-%m}: 1 invoice(s): INV-" in out.getvalue()
    assert Invoice.objects.get().month == before.date()
    with pytest.raises(CommandError, match="YYYY-MM"):
        call_command("issue_invoices", month="November")
    with pytest.raises(CommandError, match="has not ended"):
        call_command("issue_invoices", month=f"{database_now():%Y-%m}")


def test_the_database_holds_one_invoice_per_person_and_month(charged: tuple[datetime, datetime], alice: User) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    with pytest.raises(IntegrityError), transaction.atomic():
        Invoice.objects.create(
            number=invoice.number + 1, user=alice, month=invoice.month, currency="CNY", minutes=0, total=0,
            opening_balance=0, credit_added=0, credit_applied=0, balance_due=0,
        )  # fmt: skip


def test_staff_reverse_an_invoice_from_its_page_with_a_reason(
    charged: tuple[datetime, datetime], alice: User, staff: User
) -> None:
    invoice = invoices.issue(alice, charged[0].date())
    assert invoice is not None
    page, post = (
        reverse("billing-invoice", args=[invoice.number]),
        reverse("billing-invoice-reverse", args=[invoice.number]),
    )
    assert "Reverse this invoice in full" in client_of(staff).get(page).content.decode()
    assert "Reverse this invoice in full" not in client_of(alice).get(page).content.decode()
    refused = client_of(staff).post(post, {"reason": ""}, follow=True).content.decode()
    assert "Say why the invoice is reversed." in refused and CreditNote.objects.count() == 0
    done = client_of(staff).post(post, {"reason": "GPU faulty"}, follow=True).content.decode()
    note = CreditNote.objects.get(invoice=invoice)
    assert f"Reversed in full by credit note {note.label}" in done and "Reason: GPU faulty" in done
    assert "Reverse this invoice in full" not in done and note.created_by == staff
    assert f"reversed by {note.label}" in client_of(alice).get(reverse("billing-account")).content.decode()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_two_issuers_at_once_make_one_invoice_per_person_with_numbers_in_sequence(
    hold: Hold, alice: User, bob: User
) -> None:
    last, _ = months()
    for owner in (alice, bob):
        held_at(hold, owner, last + timedelta(days=2), timedelta(minutes=3))
    meter.tick()
    start = threading.Barrier(4)
    issued: list[list[int]] = []

    def issuer() -> None:
        try:
            start.wait(10)
            issued.append([invoice.number for invoice in invoices.issue_month(last.date())])
        finally:
            connection.close()

    threads = [threading.Thread(target=issuer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(issued) == 4 and all(numbers == issued[0] for numbers in issued)
    assert sorted(Invoice.objects.values_list("number", flat=True)) == [1, 2]
    assert sorted(Invoice.objects.values_list("user_id", flat=True)) == sorted([alice.pk, bob.pk])


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_issues_last_months_invoices(celery_worker: str, hold: Hold, alice: User) -> None:
    last, _ = months()
    held_at(hold, alice, last + timedelta(days=5), timedelta(minutes=4, seconds=1))  # 5 started minutes
    result = issue_invoices.delay().get(timeout=60)
    invoice = Invoice.objects.get(user=alice)
    assert result == {"month": f"{last:%Y-%m}", "invoices": [invoice.number]}
    assert invoice.minutes == 5 and invoice.total == usage_charges(alice)
