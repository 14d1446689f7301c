"""Credit as people live with it: what runs and what it burns, how long the balance lasts, monthly
budgets with alerts at 50/80/100 %, and the zero-balance stop (a warning, a grace period, then every
workload of the person's, of every kind (``sessions.gpus.workloads``: notebook sessions, render jobs), is
stopped with reason ``credit`` and charged to the moment each container was gone; nothing new starts for
them until credit is back).

The balance is the ledger's (billing/ledger.py); the cost of a running holding is its started minutes
at its frozen rate (billing/meter.py's rule), so what is shown rising is what the meter charges.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from billing import ledger, meter, money, prices
from billing.models import Account, Budget, BudgetAlert, CreditStop, Entry, LedgerTransaction, Usage
from portal import push
from portal.clock import database_now
from sessions.gpus import workloads
from sessions.gpus.models import Slice

log = logging.getLogger(__name__)
THRESHOLDS = (50, 80, 100)
MAX_BUDGET = Decimal(10_000_000)  # a month's budget larger than this is a typo
HOUR = Decimal(money.MINUTES_PER_HOUR)
MAIL_RETRY_FOR = timedelta(days=7)  # an alert's mail the server refused all week is no longer news: given up


@dataclass(frozen=True)
class Running:
    """A holding that runs now, as its owner sees it on the billing page and the session card."""

    held: Slice
    per_minute: Decimal
    minutes: int  # started so far, all of them due
    what: str
    counted_at: datetime  # the database's moment the minutes were counted at

    @property
    def cost(self) -> Decimal:
        return self.per_minute * self.minutes

    @property
    def per_hour(self) -> Decimal:
        return self.per_minute * HOUR

    @property
    def next_minute_in(self) -> float:
        """Seconds until the next minute starts, when the cost goes up again: by the database's clock, as the
        meter counts (a web process whose clock is behind would otherwise wait minutes to show it)."""
        assert self.held.held_from is not None
        due = self.held.held_from + timedelta(minutes=self.minutes)
        return max(1.0, (due - self.counted_at).total_seconds())


@dataclass(frozen=True)
class Wallet:
    balance: Decimal
    running: list[Running]

    @property
    def burn_per_hour(self) -> Decimal:
        return sum((r.per_hour for r in self.running), Decimal(0))

    @property
    def time_left(self) -> timedelta | None:
        """How long the balance lasts at the current burn; None while nothing burns."""
        if not self.burn_per_hour:
            return None
        hours = max(self.balance, Decimal(0)) / self.burn_per_hour
        return timedelta(seconds=int(hours * 3600))


def running_holdings(owner: User | int) -> QuerySet[Slice]:
    owner_id = owner if isinstance(owner, int) else owner.pk
    return Slice.objects.filter(
        owner_id=owner_id, held_from__isnull=False, held_until__isnull=True, released_at__isnull=True
    ).select_related("gpu__host")


def per_minute_of(held: Slice) -> Decimal | None:
    """The frozen rate of a holding: its usage's, or the price in force at its start before the meter has
    seen it (the same price the meter will freeze); None if no price covers it (it is not billed)."""
    return rates_of([held]).get(held.pk)


def rates_of(holdings: Sequence[Slice]) -> dict[int, Decimal]:
    """``per_minute_of`` for many holdings (their GPUs loaded) in at most two queries, whatever their number:
    the usages' frozen rates, then the prices in force at the starts of those the meter has not opened yet.
    A holding no price covers is left out."""
    ids = [held.pk for held in holdings]
    rates: dict[int, Decimal] = dict(Usage.objects.filter(slice_id__in=ids).values_list("slice_id", "per_minute"))
    unopened: list[Slice] = []
    wanted: list[tuple[prices.PriceKey, datetime]] = []
    for held in holdings:
        if held.pk not in rates and held.held_from is not None:
            unopened.append(held)
            wanted.append((prices.key_of(held, prices.market_of(held)), meter.quoted_at(held)))
    for held, price in zip(unopened, prices.in_force_at(wanted), strict=True):
        if price is not None:
            rates[held.pk] = prices.rate_of(price, held)
    return rates


def ended_at(held: Slice) -> datetime | None:
    """The end of a holding as the meter takes it: its container gone, or else its slice's release."""
    return held.held_until or held.released_at


def running_costs(holdings: Sequence[Slice], now: datetime | None = None) -> dict[int, Running]:
    """What each holding (its GPU loaded) has cost so far, by slice id, in a fixed number of queries whatever
    their number: the session cards, the billing page and the dashboard show many at once. Holdings no price
    covers, and those not begun, are left out; the database's clock is asked once, and only if needed."""
    begun = [held for held in holdings if held.held_from is not None]
    if not begun:
        return {}
    rates, names = rates_of(begun), _names(begun)
    now = now or database_now()
    found = {}
    for held in begun:
        if held.pk in rates:
            assert held.held_from is not None
            # By the clock, not capped at the last proof of life: what it will have cost once reconciliation (every
            # 20 s) confirms it runs, which the meter then charges; the history marks it "not yet charged".
            minutes = meter.minutes_due(held.held_from, ended_at(held), now, now)
            found[held.pk] = Running(held, rates[held.pk], minutes, _what(held, names), now)
    return found


def running(held: Slice, now: datetime | None = None) -> Running | None:
    return running_costs([held], now).get(held.pk)


def _names(holdings: Sequence[Slice]) -> dict[int, str]:
    """What their owners call the workloads that hold these slices (``workloads.names``), by slice."""
    holders = {held.pk: held.holder for held in holdings}
    named = workloads.names(holder for holder in holders.values() if holder is not None)
    return {slice_id: named[holder] for slice_id, holder in holders.items() if holder in named}


def _what(held: Slice, names: dict[int, str]) -> str:
    name = names.get(held.pk, "")
    return f"{name} · {held.describe()}" if name else held.describe()


def wallet(owner: User) -> Wallet:
    holdings = list(running_holdings(owner))
    costs = running_costs(holdings)  # the clock is asked only when something runs
    return Wallet(ledger.balance(owner), [costs[held.pk] for held in holdings if held.pk in costs])


def announce_charges() -> None:
    """Tell the open pages of everyone who holds a slice that their balance moved (after a meter tick)."""
    owners = Slice.objects.filter(held_from__isnull=False, held_until__isnull=True, released_at__isnull=True)
    for owner_id in set(owners.values_list("owner_id", flat=True)):
        push.notify_user(owner_id, {"type": "billing.charged"})


# Launches: refused up front when the credit does not cover a minimum number of minutes.


def launch_refusal(owner: User, per_minute: Decimal | None, spot: bool) -> str | None:
    """Why a launch at ``per_minute`` may not start: the balance must cover PORTAL_BILLING_MIN_MINUTES of
    it and of what already runs. None when it may (or nothing would be charged)."""
    minutes = settings.BILLING_MIN_MINUTES
    if not minutes or not per_minute:
        return None
    current = wallet(owner)
    need = (per_minute * HOUR + current.burn_per_hour) * minutes / HOUR
    if current.balance >= need:
        return None
    beside = " together with what already runs" if current.running else ""
    market = "spot " if spot else ""
    return (
        f"Not enough credit: this {market}slice costs {money.shown(per_minute * HOUR)} an hour, and starting it needs"
        f" credit for {minutes} minutes{beside} ({money.shown(need)}); your balance is"
        f" {money.shown(current.balance)}. Ask an operator to top up your credit, or pick a cheaper slice."
    )


def start_refusal(owner: User, per_minute: Decimal | None, spot: bool) -> str | None:
    """The gate's question for any workload's slice: nothing starts while the person's credit has run out (an
    open zero-balance warning), nor without PORTAL_BILLING_MIN_MINUTES of it covered (``launch_refusal``).
    None when it may, or when that setting is 0 (nothing is refused for credit)."""
    if not settings.BILLING_MIN_MINUTES:
        return None
    if open_stop(owner) is not None:
        return RAN_OUT
    return launch_refusal(owner, per_minute, spot)


def commitment_refusal(owner: User, cost: Decimal, what: str) -> str | None:
    """Why ``owner`` may not commit to ``cost`` (a render job's whole estimate): the balance must cover it and
    PORTAL_BILLING_MIN_MINUTES of what already runs. None when it does, or when that setting is 0."""
    refusal = start_refusal(owner, None, spot=False)  # credit run out, or checks off (no rate: no minimum here)
    if refusal or not settings.BILLING_MIN_MINUTES:
        return refusal
    current = wallet(owner)
    need = cost + current.burn_per_hour * settings.BILLING_MIN_MINUTES / HOUR
    if current.balance >= need:
        return None
    beside = f", with {settings.BILLING_MIN_MINUTES} minutes of what already runs," if current.running else ""
    return (
        f"Not enough credit: {what} comes to {money.shown(cost)}{beside} ({money.shown(need)} in all); your balance"
        f" is {money.shown(current.balance)}. Ask an operator to top up your credit, or render fewer frames,"
        " fewer samples or a smaller resolution."
    )


RAN_OUT = (
    "Your credit has run out: nothing new starts until it is topped up, and what runs is stopped at the end of the"
    " grace time. Ask an operator to top up your credit."
)


# Budgets.


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
    transaction.on_commit(lambda: send_due_mail(now), robust=True)
    return sent


def _alert(budget: Budget, month: date, threshold: int, total: Decimal, members: list[int]) -> int:
    mailed_to = User.objects.filter(pk__in=members).exclude(email="").exists()
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(budget=budget, month=month, threshold=threshold, spent=total, mail_due=mailed_to)
    except IntegrityError:
        return 0  # recorded before (by this run's predecessor or a run beside it)
    text = _alert_text(budget, month, threshold, total)
    for member in members:
        push.notify_user(member, {"type": "billing.budget", "threshold": threshold, "text": text})
    return 1


def _whose(budget: Budget) -> str:
    return "your" if budget.user_id else f"the group {budget.group}'s"


def _alert_text(budget: Budget, month: date, threshold: int, total: Decimal) -> str:
    return (
        f"You have spent {threshold} % of {_whose(budget)} budget for {month:%B %Y}:"
        f" {money.shown(total)} of {money.shown(budget.monthly)}."
    )


def send_due_mail(now: datetime | None = None) -> int:
    """Mail every alert of the last MAIL_RETRY_FOR whose mail is still due: new ones, and those whose send
    failed before (an alert is marked mailed only once the mail server took it, so the next check tries a
    failed one again); an older one still due is given up, on the record. Stops at the first failure: the
    server is down for the rest too. Returns how many went."""
    now = now or timezone.now()
    since = now - MAIL_RETRY_FOR
    give_up_mail(before=since, now=now)
    due = BudgetAlert.objects.filter(mail_due=True, sent_at__gte=since).order_by("sent_at", "threshold")
    mailed = 0
    for alert_id in list(due.values_list("pk", flat=True)):
        try:
            mailed += _mail(alert_id)
        except OSError as error:  # smtplib's errors are OSErrors too
            log.warning("budget alert %s: its mail failed, the next check tries again: %s", alert_id, error)
            BudgetAlert.objects.filter(pk=alert_id, mail_due=True).update(mail_error=_said(error))
            break
    return mailed


def give_up_mail(before: datetime, now: datetime) -> int:
    """Stop retrying the mail of alerts recorded before ``before`` that never went out: each is marked given up
    (the admin lists them, with the last error) and logged, so nobody takes silence for a sent mail."""
    with transaction.atomic():  # a check beside this one skips the rows this one gives up
        stale = BudgetAlert.objects.select_for_update(skip_locked=True).filter(mail_due=True, sent_at__lt=before)
        given_up = list(stale.values_list("pk", "mail_error"))
        count = BudgetAlert.objects.filter(pk__in=[pk for pk, _ in given_up]).update(
            mail_due=False, mail_given_up_at=now
        )
    for alert_id, error in given_up:
        log.error("budget alert %s: its mail failed for %s and is given up: %s", alert_id, MAIL_RETRY_FOR, error)
    return count


def _said(error: OSError) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _mail(alert_id: int) -> int:
    """Send one alert's mail, claimed under its row lock (a check beside this one skips it), and mark it
    mailed in the same transaction: a send that raises leaves it due."""
    with transaction.atomic():
        alert = BudgetAlert.objects.select_for_update(skip_locked=True).filter(pk=alert_id, mail_due=True).first()
        if alert is None:
            return 0
        budget = alert.budget
        members = User.objects.filter(pk=budget.user_id) if budget.user_id else budget.group.user_set.all()  # type: ignore[union-attr]
        recipients = [email for email in members.values_list("email", flat=True) if email]
        if recipients:
            subject = f"{settings.SITE_NAME}: {alert.threshold} % of {_whose(budget)} budget spent"
            send_mail(subject, _alert_text(budget, alert.month, alert.threshold, alert.spent), None, recipients)
        alert.mail_due, alert.mailed_at = False, timezone.now()
        alert.save(update_fields=["mail_due", "mailed_at"])
    return 1 if recipients else 0


# The zero-balance stop.


def open_stop(user: User) -> CreditStop | None:
    return CreditStop.objects.filter(user=user, cleared_at__isnull=True).first()


def check_balances(now: datetime | None = None) -> dict[str, int]:
    """Beat: warn whoever holds slices at a zero balance, stop every workload of theirs once the grace period is
    over, and clear the warning of whoever has credit again. The grace time runs by the database's clock,
    whichever worker's clock checks it."""
    now = now or database_now()
    holders = set(Slice.objects.filter(released_at__isnull=True).values_list("owner_id", flat=True))
    stops = {stop.user_id: stop for stop in CreditStop.objects.filter(cleared_at__isnull=True)}
    balances = _balances(holders | set(stops))
    counts = {"warned": 0, "stopped": 0, "cleared": 0}
    for user_id in holders | {user_id for user_id, stop in stops.items() if stop.stopped_at is None}:
        if balances.get(user_id, Decimal(0)) > 0:
            continue
        stop = stops.get(user_id)
        if stop is None:
            counts["warned"] += _warn(user_id, now)
        elif now >= stop.stop_at:
            counts["stopped"] += _stop(stop, now)
    for user_id, stop in stops.items():
        if balances.get(user_id, Decimal(0)) > 0:
            counts["cleared"] += clear(stop, now)
    return counts


def _balances(users: set[int]) -> dict[int, Decimal]:
    rows = (
        Entry.objects.filter(account__kind=Account.Kind.WALLET, account__user_id__in=users)
        .values("account__user_id")
        .annotate(total=Sum("amount"))
    )
    return {row["account__user_id"]: money.exact(row["total"]) for row in rows}


def _warn(user_id: int, now: datetime) -> int:
    stop_at = now + timedelta(minutes=settings.BILLING_GRACE_MINUTES)
    try:
        with transaction.atomic():
            CreditStop.objects.create(user_id=user_id, warned_at=now, stop_at=stop_at)
    except IntegrityError:
        return 0
    text = zero_balance_text(stop_at)
    push.notify_user(user_id, {"type": "billing.zero_balance", "text": text, "stop_at": stop_at.isoformat()})
    return 1


def zero_balance_text(stop_at: datetime) -> str:
    return (
        f"Your credit has run out. Your running sessions and render jobs will be stopped at {stop_at:%H:%M} UTC"
        " unless your credit is topped up, and nothing new starts until it is; ask an operator."
    )


def _stop(stop: CreditStop, now: datetime) -> int:
    """Stop every live workload of the person's, of every kind (each charged to the moment its containers were
    gone); one that starts meanwhile is stopped at the next check, and the gate lets nothing new start."""
    if CreditStop.objects.filter(pk=stop.pk, stopped_at__isnull=True).update(stopped_at=now):
        text = "Your credit has run out: your sessions and render jobs are being stopped."
        push.notify_user(stop.user_id, {"type": "billing.credit_stop", "text": text})
    return workloads.stop_all(workloads.live(stop.user_id), workloads.Reason.CREDIT)


def clear(stop: CreditStop, now: datetime | None = None) -> int:
    cleared = CreditStop.objects.filter(pk=stop.pk, cleared_at__isnull=True).update(cleared_at=now or timezone.now())
    if cleared:
        push.notify_user(stop.user_id, {"type": "billing.credit_restored", "text": "Your credit is back."})
    return cleared
