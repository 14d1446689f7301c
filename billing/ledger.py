"""The double-entry ledger: accounts, balanced postings, reversals, credit, and the balance rule.

Every transaction's entries sum to zero (PostgreSQL checks it at commit too, migration 0003); rows are
never changed, so a correction is a new transaction with every entry negated. A balance is the sum of
an account's entries, nothing cached. Money is Decimal, exact at six decimals (billing/money.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Sum

from billing import money
from billing.models import Account, Entry, LedgerTransaction
from portal.clock import database_now

Line = tuple[Account, Decimal]
MAX_CREDIT = Decimal(1_000_000)  # one grant larger than this is a typo
CREDIT_SOURCES: dict[str, str] = {
    LedgerTransaction.Kind.GRANT: Account.Kind.PROMOTIONAL,
    LedgerTransaction.Kind.TOP_UP: Account.Kind.TOP_UPS,
}


class Unbalanced(ValidationError):
    pass


class AlreadyPosted(ValidationError):
    """A transaction with this one-time key was posted before (a form sent twice): nothing was posted now."""


def portal_account(kind: str) -> Account:
    account, _ = Account.objects.get_or_create(kind=kind, user=None)
    return account


def wallet(user: User) -> Account:
    return wallet_of(user.pk)


def wallet_of(user_id: int) -> Account:
    account, _ = Account.objects.get_or_create(kind=Account.Kind.WALLET, user_id=user_id)
    return account


def post(
    kind: str,
    lines: Sequence[Line],
    memo: str,
    user: User | None = None,
    by: User | None = None,
    user_id: int | None = None,
    key: str = "",
) -> LedgerTransaction:
    """Write one balanced transaction; refuses one whose amounts do not sum to zero, and one posted with a key
    (a form's one-time key) already used (``AlreadyPosted``)."""
    if len(lines) < 2 or sum((amount for _, amount in lines), Decimal(0)) != 0:
        raise Unbalanced("A ledger transaction needs two or more entries that sum to zero.", code="unbalanced")
    owner = user.pk if user is not None else user_id
    with transaction.atomic():
        try:
            with transaction.atomic():
                posted = LedgerTransaction.objects.create(
                    kind=kind, user_id=owner, memo=memo[:300], created_by=by, key=key[:64], posted_at=database_now()
                )
        except IntegrityError:
            if key and LedgerTransaction.objects.filter(key=key[:64]).exists():
                raise AlreadyPosted(
                    "This was already posted: the form was sent twice.", code="already_posted"
                ) from None
            raise
        Entry.objects.bulk_create(
            Entry(transaction=posted, account=account, amount=amount) for account, amount in lines
        )
    return posted


def reverse(original: LedgerTransaction, by: User, reason: str) -> LedgerTransaction:
    """Undo a transaction by posting its entries negated; a transaction is reversed at most once."""
    _staff_only(by)
    if not reason.strip():
        raise ValidationError("Say why it is reversed.", code="no_reason")
    with transaction.atomic():
        if LedgerTransaction.objects.filter(reverses=original).exists():
            raise ValidationError("This transaction was already reversed.", code="already_reversed")
        lines = [(entry.account, -entry.amount) for entry in original.entries.select_related("account")]
        if len(lines) < 2 or sum((amount for _, amount in lines), Decimal(0)) != 0:
            raise Unbalanced("A ledger transaction needs two or more entries that sum to zero.", code="unbalanced")
        posted = LedgerTransaction.objects.create(
            posted_at=database_now(),
            kind=LedgerTransaction.Kind.REVERSAL,
            user=original.user,
            memo=reason[:300],
            created_by=by,
            reverses=original,
        )
        Entry.objects.bulk_create(
            Entry(transaction=posted, account=account, amount=amount) for account, amount in lines
        )
    return posted


def parse_credit(value: object) -> Decimal:
    """A credit amount from a form or a caller: positive, at most two decimals, not absurd."""
    return money.parse_amount(
        value,
        what="Credit",
        example="100 or 25.50",
        not_positive="Credit must be more than zero.",
        most=MAX_CREDIT,
        per="at once",
    )


def grant_credit(
    user: User, amount: object, by: User, reason: str, kind: str = LedgerTransaction.Kind.GRANT, key: str = ""
) -> LedgerTransaction:
    """Staff add credit to someone's wallet: promotional (a grant) or paid (a top-up), with who and why; ``key``
    is the form's one-time key (``AlreadyPosted`` when that form was sent before)."""
    _staff_only(by)
    if kind not in CREDIT_SOURCES:
        raise ValidationError("Credit is a grant or a top-up.", code="unknown_kind")
    if not reason.strip():
        raise ValidationError("Say why the credit is given.", code="no_reason")
    value = parse_credit(amount)
    source = portal_account(CREDIT_SOURCES[kind])
    return post(kind, [(source, -value), (wallet(user), value)], memo=reason.strip(), user=user, by=by, key=key)


def balance(user: User) -> Decimal:
    """What a person's wallet holds: the sum of its entries."""
    return account_balance(Account.Kind.WALLET, user)


def account_balance(kind: str, user: User | None = None) -> Decimal:
    return money.exact(
        Entry.objects.filter(account__kind=kind, account__user=user).aggregate(total=Sum("amount"))["total"]
    )


def _staff_only(by: User) -> None:
    if not by.is_staff:
        raise PermissionDenied("Only staff change credit.")
