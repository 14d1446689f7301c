"""The ledger: balanced, append-only, corrected by reversal; PostgreSQL itself refuses what breaks that."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction

from billing import ledger
from billing.models import Account, Entry, LedgerTransaction
from tests.billing.conftest import ledger_total, unbalanced_transactions

postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL enforces this")


@pytest.mark.django_db
def test_staff_grant_credit_with_who_and_why_and_the_balance_is_the_sum_of_entries(alice: User, staff: User) -> None:
    granted = ledger.grant_credit(alice, "100", by=staff, reason="welcome credit")
    ledger.grant_credit(alice, Decimal("25.50"), by=staff, reason="paid by invoice", kind="top_up")
    assert ledger.balance(alice) == Decimal("125.50")
    assert granted.created_by == staff and granted.memo == "welcome credit" and granted.posted_at is not None
    assert ledger.account_balance(Account.Kind.PROMOTIONAL) == Decimal(-100)
    assert ledger.account_balance(Account.Kind.TOP_UPS) == Decimal("-25.50")
    assert ledger_total() == 0 and unbalanced_transactions() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("amount", "code"),
    [
        ("-5", "not_positive"),
        ("0", "not_positive"),
        ("ten", "not_a_number"),
        ("1.234", "too_many_decimals"),
        ("1e9", "absurd"),
        ("Infinity", "not_a_number"),
    ],
)
def test_a_bad_credit_amount_is_refused(alice: User, staff: User, amount: str, code: str) -> None:
    with pytest.raises(ValidationError) as refused:
        ledger.grant_credit(alice, amount, by=staff, reason="test")
    assert refused.value.code == code
    assert ledger.balance(alice) == 0


@pytest.mark.django_db
def test_only_staff_grant_credit_and_always_with_a_reason(alice: User, bob: User, staff: User) -> None:
    with pytest.raises(PermissionDenied):
        ledger.grant_credit(alice, "10", by=bob, reason="a friend")
    with pytest.raises(ValidationError):
        ledger.grant_credit(alice, "10", by=staff, reason="  ")
    assert ledger.balance(alice) == 0


@pytest.mark.django_db
def test_a_correction_is_a_reversal_and_happens_once(alice: User, staff: User) -> None:
    granted = ledger.grant_credit(alice, "40", by=staff, reason="by mistake")
    reversal = ledger.reverse(granted, by=staff, reason="granted to the wrong person")
    assert ledger.balance(alice) == 0 and reversal.reverses == granted
    assert Entry.objects.filter(transaction=granted).count() == 2  # the original is still there
    with pytest.raises(ValidationError):
        ledger.reverse(granted, by=staff, reason="again")


@pytest.mark.django_db
def test_the_service_refuses_an_unbalanced_posting(alice: User) -> None:
    with pytest.raises(ledger.Unbalanced):
        ledger.post(
            "grant", [(ledger.wallet(alice), Decimal(5)), (ledger.portal_account("promotional"), Decimal(-4))], "x"
        )
    assert not LedgerTransaction.objects.exists()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_postgresql_refuses_an_unbalanced_transaction_at_commit(alice: User) -> None:
    wallet = ledger.wallet(alice)
    with pytest.raises(IntegrityError, match="does not balance"), transaction.atomic():
        posted = LedgerTransaction.objects.create(kind="grant", user=alice, memo="written past the service")
        Entry.objects.create(transaction=posted, account=wallet, amount=Decimal(1000))
    assert not Entry.objects.exists() and not LedgerTransaction.objects.exists()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_postgresql_takes_a_balanced_transaction_written_entry_by_entry(alice: User) -> None:
    with transaction.atomic():
        posted = LedgerTransaction.objects.create(kind="grant", user=alice)
        Entry.objects.create(transaction=posted, account=ledger.wallet(alice), amount=Decimal(7))
        Entry.objects.create(transaction=posted, account=ledger.portal_account("promotional"), amount=Decimal(-7))
    assert ledger.balance(alice) == 7


@postgresql_only
@pytest.mark.django_db
def test_postgresql_refuses_to_change_or_delete_ledger_rows(alice: User, staff: User) -> None:
    granted = ledger.grant_credit(alice, "10", by=staff, reason="welcome")
    for change in (
        lambda: Entry.objects.filter(transaction=granted).update(amount=Decimal(1_000)),
        lambda: Entry.objects.filter(transaction=granted).delete(),
        lambda: LedgerTransaction.objects.filter(pk=granted.pk).update(memo="rewritten"),
    ):
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
            change()
    assert ledger.balance(alice) == 10
    granted.refresh_from_db()
    assert granted.memo == "welcome"


@pytest.mark.django_db
def test_an_entry_refuses_a_second_save_and_a_delete_on_every_database(alice: User, staff: User) -> None:
    entry = ledger.grant_credit(alice, "10", by=staff, reason="welcome").entries.first()
    assert entry is not None
    with pytest.raises(ValidationError):
        entry.save()
    with pytest.raises(ValidationError):
        entry.delete()
    assert connection.vendor in ("postgresql", "sqlite")


def test_a_balance_is_exact_to_the_millionth_whatever_the_database_adds_with(alice: User, staff: User) -> None:
    """SQLite adds decimals as binary floats: 6.20 of credit less these 6.277205 of minutes came back as
    -0.0772049999999997, and a balance that should be zero could read as a hair below it (the money's property
    test found one on a fresh clone: -0.975369999999999 for -0.97537)."""
    ledger.grant_credit(alice, "6.20", by=staff, reason="course")
    revenue = ledger.portal_account(Account.Kind.REVENUE_ON_DEMAND)
    for amount in map(Decimal, ("0.299538", "0.023484", "3.258341", "2.695842")):
        lines = [(ledger.wallet(alice), -amount), (revenue, amount)]
        ledger.post(LedgerTransaction.Kind.USAGE, lines, memo="per-minute charges", user=alice)
    assert ledger.balance(alice) == Decimal("-0.077205")
    assert str(ledger.balance(alice)) == "-0.077205"
