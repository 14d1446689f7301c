"""Credit as the gate to new work, and the zero-balance stop: a launch or a job's commitment is refused when the
balance does not cover PORTAL_BILLING_MIN_MINUTES of it; at zero a warning, a grace period, then every workload
of the person's, of every kind (``sessions.gpus.workloads``: notebook sessions, render jobs), is stopped with
reason ``credit`` and charged to the moment each container was gone; nothing new starts for them until credit is
back. Running costs are ``billing.costs``, budgets ``billing.budgets``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from billing import money
from billing.costs import HOUR, wallet
from billing.models import Account, CreditStop, Entry
from portal import push
from portal.clock import database_now
from sessions.gpus import workloads
from sessions.gpus.models import Slice

log = logging.getLogger(__name__)


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
