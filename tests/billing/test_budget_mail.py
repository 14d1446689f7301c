"""A budget alert's mail is marked sent only once a mail server took it: a send that fails (an SMTP server
that is not there) leaves it due, and a later check sends it; a week of failures gives it up, on the record
staff see in the admin; the alert itself is shown and pushed once."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client, TestCase
from django.urls import reverse

from billing import budget_mail, budgets, meter
from billing.models import BudgetAlert
from tests.billing.conftest import Hold

pytestmark = pytest.mark.django_db
SMTP = "django.core.mail.backends.smtp.EmailBackend"
MEMORY = "django.core.mail.backends.locmem.EmailBackend"


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that is bound but not listening: every connection to it is refused at once."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


def check_budgets_and_commit(now: datetime | None = None) -> int:
    """One beat check, its after-commit work (the mail) run as a committed check would run it."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        return budgets.check_budgets(now)


def alerts_on_the_dashboard(user: User) -> int:
    client = Client()
    client.force_login(user)
    return client.get(reverse("dashboard")).content.decode().count('data-testid="budget-alert"')


def test_a_budget_alert_whose_mail_failed_stays_due_and_a_later_check_sends_it_once(
    hold: Hold,
    alice: User,
    closed_port: int,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = SMTP, "127.0.0.1", closed_port
    settings.EMAIL_TIMEOUT = 5
    budgets.set_budget("1.00", by=alice, user=alice)
    hold(alice, timedelta(minutes=4), lasted=timedelta(minutes=4))  # 0.57 of 1.00: the 50 % alert
    meter.tick()

    assert check_budgets_and_commit() == 1
    alert = BudgetAlert.objects.get()
    assert alert.threshold == 50 and alert.mail_due and alert.mailed_at is None  # refused: not marked sent
    assert alerts_on_the_dashboard(alice) == 1

    assert check_budgets_and_commit() == 0  # the server is still not there: no new alert, still due
    alert.refresh_from_db()
    assert alert.mail_due and alert.mailed_at is None

    settings.EMAIL_BACKEND = MEMORY  # the mail server is back
    assert check_budgets_and_commit() == 0
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["alice@example.org"]
    assert "50 % of your budget" in mail.outbox[0].body and "0.57 CNY of 1.00 CNY" in mail.outbox[0].body
    alert.refresh_from_db()
    assert not alert.mail_due and alert.mailed_at is not None

    assert check_budgets_and_commit() == 0
    assert len(mail.outbox) == 1  # sent once
    assert alerts_on_the_dashboard(alice) == 1  # shown once, however often the mail was tried


def test_one_refused_mail_holds_back_none_that_went_before_it(
    hold: Hold,
    alice: User,
    bob: User,
    closed_port: int,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    budgets.set_budget("1.00", by=alice, user=alice)
    hold(alice, timedelta(minutes=4), lasted=timedelta(minutes=4))
    meter.tick()
    assert check_budgets_and_commit() == 1  # the memory backend: alice's went
    assert len(mail.outbox) == 1

    settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = SMTP, "127.0.0.1", closed_port
    budgets.set_budget("1.00", by=bob, user=bob)
    hold(bob, timedelta(minutes=8), lasted=timedelta(minutes=8))  # 1.13: 50, 80 and 100 %
    meter.tick()
    assert check_budgets_and_commit() == 3
    due = BudgetAlert.objects.filter(budget__user=bob, mail_due=True, mailed_at__isnull=True)
    assert due.count() == 3
    assert BudgetAlert.objects.get(budget__user=alice).mailed_at is not None  # never sent again

    settings.EMAIL_BACKEND = MEMORY
    assert check_budgets_and_commit() == 0
    assert [message.to for message in mail.outbox] == [["alice@example.org"]] + [["bob@example.org"]] * 3
    assert not BudgetAlert.objects.filter(mail_due=True).exists()


def test_an_alert_for_someone_without_a_mail_address_is_not_left_due(hold: Hold, alice: User) -> None:
    User.objects.filter(pk=alice.pk).update(email="")
    budgets.set_budget("1.00", by=alice, user=alice)
    hold(alice, timedelta(minutes=4), lasted=timedelta(minutes=4))
    meter.tick()
    assert check_budgets_and_commit() == 1
    assert not BudgetAlert.objects.get().mail_due and not mail.outbox


def test_a_mail_that_fails_for_a_week_is_given_up_on_the_record_staff_see_in_the_admin(
    hold: Hold,
    alice: User,
    closed_port: int,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = SMTP, "127.0.0.1", closed_port
    settings.EMAIL_TIMEOUT = 5
    budgets.set_budget("1.00", by=alice, user=alice)
    hold(alice, timedelta(minutes=4), lasted=timedelta(minutes=4))
    meter.tick()
    assert check_budgets_and_commit() == 1
    alert = BudgetAlert.objects.get()
    assert alert.mail_due and "ConnectionRefusedError" in alert.mail_error  # why it failed, kept

    six_days_on = alert.sent_at + timedelta(days=6)
    check_budgets_and_commit(six_days_on)  # still refused, still within the week: still due
    alert.refresh_from_db()
    assert alert.mail_due and alert.mail_given_up_at is None

    settings.EMAIL_BACKEND = MEMORY  # the server is back, but a week and a day after the alert
    a_week_on = alert.sent_at + budget_mail.MAIL_RETRY_FOR + timedelta(days=1)
    check_budgets_and_commit(a_week_on)
    alert.refresh_from_db()
    assert not alert.mail_due and alert.mailed_at is None and alert.mail_given_up_at == a_week_on
    assert not mail.outbox  # news a week old is not sent; the record says it never went
    check_budgets_and_commit(a_week_on + timedelta(minutes=1))
    alert.refresh_from_db()
    assert alert.mail_given_up_at == a_week_on  # given up once

    root = User.objects.create_superuser("root", "root@example.org", "pw-root-mail")
    admin = Client()
    admin.force_login(root)
    listed = admin.get(reverse("admin:billing_budgetalert_changelist") + "?mail=given_up").content.decode()
    assert "GIVEN UP" in listed and "never sent" in listed and "ConnectionRefusedError" in listed
    sent_only = admin.get(reverse("admin:billing_budgetalert_changelist") + "?mail=sent").content.decode()
    assert "GIVEN UP" not in sent_only
