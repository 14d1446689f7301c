"""Credit as people live with it: staff add it with a reason, the balance's burn and time left, a launch
the credit cannot carry is refused before anything is allocated, and the zero-balance warning and stop."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing import costs, credit, ledger, meter, money
from billing.models import CreditStop, LedgerTransaction
from sessions.gpus import holdings
from sessions.gpus.models import Slice
from sessions.notebooks.models import NotebookImage, NotebookSession
from sessions.notebooks.services import ContainerEnd, Launch, LaunchRefused, record_event, start_session
from tests.billing.conftest import A100, H200_3G, Hold
from tests.factories import running_session

pytestmark = pytest.mark.django_db
A100_HOUR = money.per_minute(Decimal("8.5")) * 60  # 8.50002: what 60 started minutes cost
CREDIT = reverse("billing-credit")


@pytest.fixture
def image(fleet: object) -> NotebookImage:
    found, _ = NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "gpu-portal/notebook:latest"})
    return found


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_staff_add_credit_with_a_reason_and_the_page_says_who_when_and_why(alice: User, staff: User) -> None:
    form = {"username": "alice", "amount": "25.50", "kind": "top_up", "reason": "invoice 2026-114", "key": "k1"}
    answer = client_of(staff).post(CREDIT, form)
    assert answer.status_code == 302
    assert ledger.balance(alice) == Decimal("25.50")
    given = LedgerTransaction.objects.get(user=alice)
    assert given.kind == "top_up" and given.created_by == staff and given.memo == "invoice 2026-114"
    page = client_of(staff).get(CREDIT).content.decode()
    assert "invoice 2026-114" in page and "25.50 CNY" in page and "charlie" in page


@pytest.mark.parametrize(
    ("amount", "words"),
    [
        ("-5", "more than zero"),
        ("0", "more than zero"),
        ("ten", "is a number"),
        ("NaN", "is a number"),
        ("5000000", "check the figure"),
        ("1.234", "at most 2 decimals"),
    ],
)
def test_bad_top_ups_are_refused_in_words_and_nothing_is_posted(
    alice: User, staff: User, amount: str, words: str
) -> None:
    form = {"username": "alice", "amount": amount, "kind": "top_up", "reason": "typo", "key": "k2"}
    answer = client_of(staff).post(CREDIT, form)
    assert answer.status_code == 400 and words in answer.content.decode()
    assert not LedgerTransaction.objects.exists()


def test_credit_without_a_reason_or_for_nobody_is_refused(alice: User, staff: User) -> None:
    blank = {"username": "alice", "amount": "5", "kind": "grant", "reason": " ", "key": "k3"}
    no_one = {"username": "zed", "amount": "5", "kind": "grant", "reason": "hi", "key": "k4"}
    no_reason, nobody = client_of(staff).post(CREDIT, blank), client_of(staff).post(CREDIT, no_one)
    assert no_reason.status_code == 400 and nobody.status_code == 400
    assert "Nobody has that user name" in nobody.content.decode()
    assert not LedgerTransaction.objects.exists()


def test_people_who_are_not_staff_cannot_open_or_post_to_the_credit_page(alice: User, alice_client: Client) -> None:
    assert alice_client.get(CREDIT).status_code == 403
    form = {"username": "alice", "amount": "100", "kind": "top_up", "reason": "me"}
    assert alice_client.post(CREDIT, form).status_code == 403
    assert ledger.balance(alice) == 0


def test_burn_rate_and_time_left_follow_what_runs(hold: Hold, alice: User, staff: User) -> None:
    ledger.grant_credit(alice, "17.00", by=staff, reason="course")
    assert costs.wallet(alice).time_left is None  # nothing burns
    hold(alice, timedelta(seconds=30))
    hold(alice, timedelta(seconds=30))
    wallet = costs.wallet(alice)
    assert wallet.burn_per_hour == 2 * A100_HOUR
    assert abs(wallet.time_left - timedelta(hours=1)) < timedelta(seconds=2)  # type: ignore[operator]
    assert [r.cost for r in wallet.running] == [A100_HOUR / 60] * 2  # the first minute is due at once


def test_a_cost_so_fars_next_refresh_counts_from_the_databases_moment_not_the_web_processes_clock(
    hold: Hold, alice: User
) -> None:
    held = hold(alice, timedelta(minutes=10))
    assert held.held_from is not None
    found = costs.running_costs([held], now=held.held_from + timedelta(seconds=30))[held.pk]
    assert found.minutes == 1 and found.next_minute_in == 30.0  # the web's clock would say 9 minutes late


def test_a_holding_that_ended_no_longer_burns(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(minutes=5), lasted=timedelta(minutes=2))
    assert costs.wallet(alice).burn_per_hour == 0


def test_a_launch_the_credit_cannot_carry_is_refused_before_anything_is_allocated(
    image: NotebookImage, alice: User, staff: User, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.BILLING_MIN_MINUTES = 10
    ledger.grant_credit(alice, "1.00", by=staff, reason="trial")  # 10 minutes of an A100 cost 1.42
    with pytest.raises(LaunchRefused) as refused:
        start_session(alice, Launch(A100, image.pk, "lab"))
    assert refused.value.code == "credit"
    assert "Not enough credit" in refused.value.reason and "1.42 CNY" in refused.value.reason
    assert not Slice.objects.exists() and not NotebookSession.objects.exists()


def test_the_minimum_counts_what_already_runs(
    hold: Hold, image: NotebookImage, alice: User, staff: User, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.BILLING_MIN_MINUTES = 10
    ledger.grant_credit(alice, "2.00", by=staff, reason="trial")
    hold(alice, timedelta(seconds=10))  # an A100 burning already: two of them need 2.83 for 10 minutes
    with pytest.raises(LaunchRefused, match="together with what already runs"):
        start_session(alice, Launch(A100, image.pk, "second"))


def test_a_launch_the_credit_carries_starts(image: NotebookImage, alice: User, staff: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.BILLING_MIN_MINUTES = 10
    ledger.grant_credit(alice, "1.50", by=staff, reason="trial")
    session = start_session(alice, Launch(A100, image.pk, "lab"))
    assert session.state == NotebookSession.State.STARTING and session.slice_id is not None


def test_the_launch_form_says_why_and_allocates_nothing(image: NotebookImage, alice_client: Client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.BILLING_MIN_MINUTES = 10
    form = {"offer": "mig:H200-SXM5-141GB:3g.71gb", "image": image.pk, "server_name": "lab"}
    answer = alice_client.post(reverse("session-launch"), form)
    text = answer.content.decode()
    assert "Not enough credit" in text and "your balance is 0.00 CNY" in text
    assert not Slice.objects.exists()


def test_at_zero_balance_people_are_warned_then_stopped_after_the_grace_time(
    image: NotebookImage, alice: User, bob: User, staff: User, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.BILLING_GRACE_MINUTES = 5
    ledger.grant_credit(bob, "100", by=staff, reason="paid")
    broke = running_session(alice, image, H200_3G, "broke")
    fine = running_session(bob, image, H200_3G, "fine")
    for session in (broke, fine):
        holdings.started(session.slice_id, session.container_started_at)  # type: ignore[arg-type]
    now = timezone.now()
    assert credit.check_balances(now) == {"warned": 1, "stopped": 0, "cleared": 0}
    warning = CreditStop.objects.get(user=alice)
    assert warning.stop_at == now + timedelta(minutes=5)
    assert credit.check_balances(now + timedelta(minutes=4)) == {"warned": 0, "stopped": 0, "cleared": 0}
    assert credit.check_balances(now + timedelta(minutes=5)) == {"warned": 0, "stopped": 1, "cleared": 0}
    broke.refresh_from_db()
    fine.refresh_from_db()
    assert broke.state == NotebookSession.State.STOPPING and broke.ended_reason == NotebookSession.EndReason.CREDIT
    assert fine.state == NotebookSession.State.RUNNING


def test_a_session_stopped_for_credit_is_charged_to_the_moment_its_container_is_gone(
    image: NotebookImage, alice: User, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.BILLING_GRACE_MINUTES = 0
    session = running_session(alice, image, H200_3G, "broke")
    started = timezone.now() - timedelta(minutes=7, seconds=30)
    NotebookSession.objects.filter(pk=session.pk).update(container_started_at=started)
    holdings.started(session.slice_id, started)  # type: ignore[arg-type]
    credit.check_balances()
    credit.check_balances()
    gone = started + timedelta(minutes=7, seconds=30)
    record_event(session.pk, "stopped", end=ContainerEnd(at=gone, exit_code=0))
    meter.charge_holding(session.slice_id)  # type: ignore[arg-type]
    session.refresh_from_db()
    assert session.ended_reason == NotebookSession.EndReason.CREDIT
    rate = costs.per_minute_of(Slice.objects.get(pk=session.slice_id or 0))
    assert rate is not None and ledger.balance(alice) == -8 * rate  # minutes 0..7: the eighth had begun


def test_credit_that_comes_back_clears_the_warning(hold: Hold, alice: User, staff: User) -> None:
    hold(alice, timedelta(seconds=5))
    credit.check_balances()
    ledger.grant_credit(alice, "50", by=staff, reason="top-up")
    assert credit.check_balances()["cleared"] == 1
    assert credit.open_stop(alice) is None
    assert "Your credit has run out" not in client_of(alice).get(reverse("dashboard")).content.decode()


def test_the_dashboard_shows_the_zero_balance_warning_and_the_balance(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(seconds=5))
    credit.check_balances()
    page = client_of(alice).get(reverse("dashboard")).content.decode()
    assert "Your credit has run out" in page and "will be stopped at" in page
    assert "0.00 CNY" in page and "nothing left to burn" in page


def test_a_credit_form_sent_twice_grants_once(alice: User, staff: User) -> None:
    """A double click, or a reload that posts again (issue 30, money 6): the form's one-time key is posted once."""
    page = client_of(staff).get(CREDIT).content.decode()
    key = re.search(r'name="key" value="([^"]+)"', page)
    assert key is not None
    form = {"username": "alice", "amount": "10", "kind": "top_up", "reason": "invoice 2026-120", "key": key.group(1)}
    first, second = client_of(staff).post(CREDIT, form), client_of(staff).post(CREDIT, form, follow=True)
    assert first.status_code == 302 and second.status_code == 200
    assert "already added; it was not added again" in second.content.decode()
    assert ledger.balance(alice) == Decimal(10) and LedgerTransaction.objects.filter(user=alice).count() == 1
    other = re.search(r'name="key" value="([^"]+)"', client_of(staff).get(CREDIT).content.decode())
    assert other is not None and other.group(1) != key.group(1)  # the next form shown posts again
