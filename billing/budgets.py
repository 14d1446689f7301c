"""Monthly budgets, a person's or a group's, with alerts at 50/80/100 % of what was spent in the month (on the page
at once; by mail through ``billing.budget_mail``)."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime
from decimal import Decimal

from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from billing import budget_mail, money
from billing.models import Account, Budget, BudgetAlert, Entry, LedgerTransaction
from portal import push
from portal.clock import database_now

log = logging.getLogger(__name__)
THRESHOLDS = (50, 80, 100)
MAX_BUDGET = Decimal(10_000_000)  # a month's budget larger than this is a typo


def month_of(moment: datetime) -> date:
    return moment.astimezone(UTC).date().replace(day=1)


def _month_bounds(month: date) -> tuple[datetime, datetime]:
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    following = datetime(month.year + month.month // 12, month.month % 12 + 1, 1, tzinfo=UTC)
    return start, following


def _spending(month: date) -> QuerySet[Entry]:
    """Wallet entries of the month's charges (and of their reversals and settlements, which give money back)."""
    start, end = _month_bounds(month)
    charges = Q(transaction__kind__in=[LedgerTransaction.Kind.USAGE, LedgerTransaction.Kind.SETTLEMENT]) | Q(
        transaction__kind=LedgerTransaction.Kind.REVERSAL, transaction__reverses__kind=LedgerTransaction.Kind.USAGE
    )
    return Entry.objects.filter(
        charges, account__kind=Account.Kind.WALLET, transaction__posted_at__gte=start, transaction__posted_at__lt=end
    )


def spent_by_person(month: date, users: list[int] | None = None) -> dict[int, Decimal]:
    entries = _spending(month)
    if users is not None:
        entries = entries.filter(account__user_id__in=users)
    rows = entries.values("account__user_id").annotate(total=Sum("amount"))
    return {row["account__user_id"]: -money.exact(row["total"]) for row in rows}


def spent(budget: Budget, month: date) -> Decimal:
    members = [budget.user_id] if budget.user_id else list(budget.group.user_set.values_list("pk", flat=True))  # type: ignore[union-attr]
    return sum(spent_by_person(month, members).values(), Decimal(0))


def parse_budget(value: object) -> Decimal:
    """A monthly budget from a form: a number above zero, at most two decimals, not absurd."""
    return money.parse_amount(
        value,
        what="A budget",
        example="500 or 99.50",
        not_positive="A budget is more than zero; remove it to have none.",
        most=MAX_BUDGET,
        per="a month",
    )


def set_budget(monthly: object, by: User, user: User | None = None, group: Group | None = None) -> Budget:
    """A person sets their own budget; staff set anyone's and each group's. Alerts already sent this month stay."""
    if (user is None) == (group is None):
        raise ValidationError("A budget is for one person or one group.", code="whose")
    if not by.is_staff and (group is not None or user != by):
        raise PermissionDenied("Only staff set budgets for others and for groups.")
    amount = parse_budget(monthly)
    budget, _ = Budget.objects.update_or_create(
        user=user, group=group, defaults={"monthly": amount, "set_by": by, "set_at": timezone.now()}
    )
    return budget


def remove_budget(by: User, user: User | None = None, group: Group | None = None) -> None:
    if not by.is_staff and (group is not None or user != by):
        raise PermissionDenied("Only staff remove budgets of others and of groups.")
    Budget.objects.filter(user=user, group=group).delete()


def budget_for(user: User) -> Budget | None:
    return Budget.objects.filter(user=user).first()


def alerts_for(user: User, month: date) -> QuerySet[BudgetAlert]:
    """This month's alerts of the person's own budget and of their groups' budgets."""
    mine = Q(budget__user=user) | Q(budget__group__in=user.groups.all())
    return BudgetAlert.objects.filter(mine, month=month).select_related("budget__group", "budget__user")


def check_budgets(now: datetime | None = None) -> int:
    """Beat: record every threshold crossed this month (shown once on the dashboard and pushed once), then
    mail each alert whose mail is still due; returns how many alerts were new. The month is the database's,
    the clock the charges were posted by."""
    now = now or database_now()
    month = month_of(now)
    by_person = spent_by_person(month)
    memberships: dict[int, list[int]] = {}
    for user_id, group_id in User.groups.through.objects.values_list("user_id", "group_id"):
        memberships.setdefault(group_id, []).append(user_id)
    recorded = set(BudgetAlert.objects.filter(month=month).values_list("budget_id", "threshold"))
    sent = 0
    for budget in Budget.objects.select_related("user", "group"):
        members = [budget.user_id] if budget.user_id else memberships.get(budget.group_id or 0, [])
        total = sum((by_person.get(member, Decimal(0)) for member in members), Decimal(0))
        for threshold in THRESHOLDS:
            if total * 100 >= budget.monthly * threshold and (budget.pk, threshold) not in recorded:
                sent += _alert(budget, month, threshold, total, members)
    transaction.on_commit(lambda: budget_mail.send_due_mail(now), robust=True)
    return sent


def _alert(budget: Budget, month: date, threshold: int, total: Decimal, members: list[int]) -> int:
    mailed_to = User.objects.filter(pk__in=members).exclude(email="").exists()
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(budget=budget, month=month, threshold=threshold, spent=total, mail_due=mailed_to)
    except IntegrityError:
        return 0  # recorded before (by this run's predecessor or a run beside it)
    text = budget_mail.alert_text(budget, month, threshold, total)
    for member in members:
        push.notify_user(member, {"type": "billing.budget", "threshold": threshold, "text": text})
    return 1
