"""A person's billing page, the session card's cost and the launch form's prices: their own money only."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group, User
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing import budgets, costs, ledger, meter
from billing.models import Budget, BudgetAlert, Price
from portal.clock import database_now
from sessions.gpus import holdings
from sessions.notebooks.models import NotebookImage
from tests.billing.conftest import A30_SHARE, H200_3G, Hold
from tests.factories import running_session

pytestmark = pytest.mark.django_db
PAGE = reverse("billing-account")


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_page_shows_balance_burn_time_left_and_what_runs(hold: Hold, alice: User, staff: User) -> None:
    ledger.grant_credit(alice, "17.10", by=staff, reason="course")
    hold(alice, timedelta(minutes=2, seconds=10))
    page = client_of(alice).get(PAGE).content.decode()
    assert "17.10 CNY" in page and "8.50 CNY/h" in page and "2 h 00 min" in page
    assert "0.43 CNY" in page and "3 started minutes" in page  # three minutes have begun: 3 x 0.141667
    assert "Invoices" in page


def test_the_cost_of_someone_elses_holding_is_a_404(hold: Hold, alice: User, bob: User, staff: User) -> None:
    held = hold(bob, timedelta(minutes=1))
    url = reverse("billing-holding-cost", args=[held.pk])
    assert client_of(alice).get(url).status_code == 404
    assert client_of(staff).get(url).status_code == 404  # operators may stop it, not read its owner's money
    answer = client_of(bob).get(url)
    assert answer.status_code == 200 and "0.28 CNY" in answer.content.decode()
    assert 'hx-trigger="load delay:' in answer.content.decode()  # fetched again when the next minute starts


def test_the_page_never_shows_another_persons_usage(hold: Hold, alice: User, bob: User) -> None:
    hold(bob, timedelta(minutes=3), request=H200_3G)
    meter.tick()
    page = client_of(alice).get(PAGE).content.decode()
    assert "No usage in this range" in page and "Nothing runs now" in page and "3g.71gb" not in page


def test_history_filters_by_kind_and_gpu(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(minutes=3), request=H200_3G, lasted=timedelta(minutes=2))
    hold(alice, timedelta(minutes=3), request=A30_SHARE, lasted=timedelta(minutes=1))
    meter.tick()
    client = client_of(alice)
    everything = client.get(PAGE).content.decode()
    assert everything.count('data-testid="usage-row"') == 2
    mig = client.get(PAGE, {"kind": "mig"}).content.decode()
    assert mig.count('data-testid="usage-row"') == 1 and "3g.71gb" in mig
    a30 = client.get(PAGE, {"model": "A30-24GB"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="history").content.decode()
    assert a30.lstrip().startswith('<section aria-labelledby="history-heading"') and a30.count("usage-row") == 1


def test_each_usage_in_the_history_says_what_held_the_slice(hold: Hold, alice: User) -> None:
    held = hold(alice, timedelta(minutes=3), request=H200_3G, lasted=timedelta(minutes=2))
    meter.tick()
    page = client_of(alice).get(PAGE).content.decode()
    holder = held.holder
    assert holder is not None
    assert f'<a href="{holder.url}" data-testid="slice-holder">{holder.label}</a>' in page


def test_the_history_filters_show_the_range_and_kind_they_used(alice: User) -> None:
    today = timezone.now().date()
    page = client_of(alice).get(PAGE, {"kind": "mig"}).content.decode()
    assert f'name="start" value="{today - timedelta(days=29)}"' in page and f'name="end" value="{today}"' in page
    assert '<option value="mig" selected>' in page


def test_a_range_backwards_is_refused_in_words(alice: User) -> None:
    page = client_of(alice).get(PAGE, {"start": "2026-05-10", "end": "2026-05-01"}).content.decode()
    assert "&#x27;From&#x27; is after &#x27;To&#x27;." in page


@pytest.mark.parametrize(
    ("monthly", "words"), [("-10", "more than zero"), ("0", "more than zero"), ("lots", "a number")]
)
def test_a_budget_below_zero_or_not_a_number_is_refused(alice: User, monthly: str, words: str) -> None:
    answer = client_of(alice).post(reverse("billing-budget"), {"monthly": monthly})
    assert answer.status_code == 400 and words in answer.content.decode()
    assert not Budget.objects.exists()


def test_people_set_their_own_budget_but_not_a_groups(alice: User) -> None:
    assert client_of(alice).post(reverse("billing-budget"), {"monthly": "100"}).status_code == 302
    assert Budget.objects.get(user=alice).monthly == 100
    group = Group.objects.get(name="users")
    answer = client_of(alice).post(reverse("billing-budgets"), {"group": group.pk, "monthly": "5"})
    assert answer.status_code == 403 and not Budget.objects.filter(group=group).exists()


def test_budget_alerts_go_out_once_each_by_mail_and_on_the_page(hold: Hold, alice: User, staff: User) -> None:
    budgets.set_budget("1.00", by=alice, user=alice)
    hold(alice, timedelta(minutes=4), lasted=timedelta(minutes=4))  # 4 minutes: 0.57 of 1.00
    meter.tick()
    with django_capture_on_commit() as callbacks:
        assert budgets.check_budgets() == 1
    assert [a.threshold for a in BudgetAlert.objects.all()] == [50]
    assert callbacks and len(mail.outbox) == 1 and "50 % of your budget" in mail.outbox[0].body
    assert mail.outbox[0].to == ["alice@example.org"]
    hold(alice, timedelta(minutes=4), lasted=timedelta(minutes=4))  # 1.13 now: 80 and 100 too
    meter.tick()
    assert budgets.check_budgets() == 2 and budgets.check_budgets() == 0
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [50, 80, 100]
    page = client_of(alice).get(reverse("dashboard")).content.decode()
    assert "100 % of your budget" in page and "80 % of your budget" in page


def test_a_group_budget_alerts_every_member(hold: Hold, alice: User, bob: User, staff: User) -> None:
    team = Group.objects.create(name="team")
    team.user_set.add(alice, bob)
    budgets.set_budget("1.00", by=staff, group=team)
    hold(alice, timedelta(minutes=3), lasted=timedelta(minutes=3))
    hold(bob, timedelta(minutes=3), lasted=timedelta(minutes=3))  # together 0.85: 50 and 80 %
    meter.tick()
    assert budgets.check_budgets() == 2
    assert "the group team" in client_of(bob).get(reverse("dashboard")).content.decode()


def test_the_launch_form_shows_prices_spot_balance_and_hours(
    fleet: object, alice: User, staff: User, alice_client: Client
) -> None:
    NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "x"})
    ledger.grant_credit(alice, "17.10", by=staff, reason="course")
    page = alice_client.get(reverse("session-list")).content.decode()
    assert "A100-SXM4-80GB · whole GPU (80 GiB) — 8 free — 8.50 CNY/h, spot 3.40 CNY/h" in page
    # 17.10 at 60 minutes of 0.141667 (on-demand) and of 0.056667 (spot)
    assert 'data-testid="launch-balance">17.10 CNY' in page
    assert '<span data-price>2 h 00 min</span><span class="muted" data-price>spot 5 h 01 min</span>' in page
    assert "per started minute" in page


def test_the_currency_setting_names_every_amount_shown(
    hold: Hold,
    alice: User,
    staff: User,
    alice_client: Client,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.CURRENCY = "EUR"
    NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "x"})
    ledger.grant_credit(alice, "17.10", by=staff, reason="course")
    hold(alice, timedelta(minutes=2, seconds=10))
    launch_form = alice_client.get(reverse("session-list")).content.decode()
    assert "8.50 EUR/h, spot 3.40 EUR/h" in launch_form and "CNY" not in launch_form
    page = alice_client.get(PAGE).content.decode()
    assert "17.10 EUR" in page and "0.43 EUR" in page and "CNY" not in page


def test_the_session_card_shows_its_cost_so_far(fleet: object, alice: User, alice_client: Client) -> None:
    image, _ = NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "x"})
    session = running_session(alice, image, H200_3G, "lab")
    holdings.started(session.slice_id, database_now())  # type: ignore[arg-type]  # the meter's clock
    session.slice.refresh_from_db()  # type: ignore[union-attr]
    page = alice_client.get(reverse("session-list")).content.decode()
    rate = costs.per_minute_of(session.slice)  # type: ignore[arg-type]
    assert rate is not None and f'Cost: <span class="holding-cost" id="cost-{session.slice_id}"' in page
    assert f"{rate.quantize(Decimal('0.01'))} CNY" in page and "1 started minute" in page


def django_capture_on_commit():  # type: ignore[no-untyped-def]
    from django.test import TestCase

    return TestCase.captureOnCommitCallbacks(execute=True)


def test_a_holding_no_price_covers_says_it_is_not_billed(hold: Hold, alice: User) -> None:
    Price.objects.filter(model_name="A100-SXM4-80GB", kind="whole").delete()  # no usage froze them yet
    held = hold(alice, timedelta(minutes=2))
    card = client_of(alice).get(reverse("billing-holding-cost", args=[held.pk])).content.decode()
    assert "no price covers it: not billed" in card and "hx-get" not in card  # nothing to follow live


def test_minutes_given_back_are_shown_to_their_owner_with_why_and_to_nobody_else(
    hold: Hold, alice: User, bob: User, staff: User
) -> None:
    """A settlement is the person's money coming back: listed on their page beside the credit they were given,
    with the words that say why (issue 30: 'shown to the person as such')."""
    ledger.grant_credit(alice, "5.00", by=staff, reason="course")
    held = hold(alice, timedelta(minutes=3, seconds=5))
    meter.tick()
    assert held.held_from is not None
    holdings.ended(held.pk, held.held_from, held.held_from + timedelta(minutes=2, seconds=30))
    meter.charge_holding(held.pk)
    page = client_of(alice).get(PAGE).content.decode()
    assert page.count('data-testid="money-in-row"') == 2
    assert 'data-kind="settlement"' in page and "Minutes past a holding&#x27;s end given back" in page
    assert "1 minute charged after Notebook session #" in page and "0.14 CNY" in page
    assert 'data-kind="top_up"' not in page and "course" in page and "5.00 CNY" in page
    assert "money-in-row" not in client_of(bob).get(PAGE).content.decode()


def test_what_runs_is_named_as_its_owner_named_it_for_every_kind_of_workload(fleet: object, alice: User) -> None:
    """Billing asks the workload registry, not a workload's models: a session by its server name, a render job by
    its scene file, both in one query per kind."""
    from sessions.gpus.allocator import allocate
    from sessions.gpus.holders import Holder
    from sessions.render.models import RenderJob
    from tests.billing.conftest import A100
    from tests.factories import one_frame_a_chunk

    image, _ = NotebookImage.objects.get_or_create(name="JupyterLab", defaults={"image": "gpu-portal/notebook:latest"})
    session = running_session(alice, image, A100, "thesis")
    job = one_frame_a_chunk(alice, RenderJob.State.RENDERING, frames=1, max_slices=1)
    rendering = allocate(alice, A100, holder=Holder.render(job.pk))
    assert session.slice is not None
    for held in (session.slice, rendering):
        holdings.started(held.pk, database_now() - timedelta(seconds=30))
    found = {running.held.pk: running.what for running in costs.wallet(alice).running}
    assert found[session.slice.pk].startswith("thesis · ")
    assert found[rendering.pk].startswith("shot.blend · ")
