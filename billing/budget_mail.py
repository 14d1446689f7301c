"""Budget alerts in words, and by mail: each sent once, retried while the mail server refuses, given up after a
week."""

from __future__ import annotations

import logging
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from billing import money
from billing.models import Budget, BudgetAlert

log = logging.getLogger(__name__)
MAIL_RETRY_FOR = timedelta(days=7)  # an alert's mail the server refused all week is no longer news: given up


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
            subject = f"{settings.SITE_NAME}: {alert.threshold} % of {whose(budget)} budget spent"
            send_mail(subject, alert_text(budget, alert.month, alert.threshold, alert.spent), None, recipients)
        alert.mail_due, alert.mailed_at = False, timezone.now()
        alert.save(update_fields=["mail_due", "mailed_at"])
    return 1 if recipients else 0


# The zero-balance stop.


def whose(budget: Budget) -> str:
    return "your" if budget.user_id else f"the group {budget.group}'s"


def alert_text(budget: Budget, month: date, threshold: int, total: Decimal) -> str:
    return (
        f"You have spent {threshold} % of {whose(budget)} budget for {month:%B %Y}:"
        f" {money.shown(total)} of {money.shown(budget.monthly)}."
    )
