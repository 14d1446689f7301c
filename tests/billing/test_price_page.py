"""The staff's price page and the Django admin: see prices, add one, and be refused in words."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from billing.models import Entry, Price
from portal.clock import database_now
from tests.billing.conftest import Hold

pytestmark = pytest.mark.django_db
URL = reverse("billing-prices")


def staff_client(staff: User) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def a_price(**changes: str) -> dict[str, str]:
    form = {"model_name": "A100-SXM4-80GB", "kind": "whole", "profile": "", "market": "on_demand"}
    return {**form, "per_hour": "9.5", "effective_from": "", "source": "new contract", **changes}


def test_staff_see_the_prices_in_force_and_the_nav_links_to_them(fleet: object, staff: User) -> None:
    page = staff_client(staff).get(URL)
    assert page.status_code == 200
    text = page.content.decode()
    assert "A100-SXM4-80GB" in text and "8.5000" in text and "0.141667" in text and "CNY" in text
    assert f'href="{URL}"' in text


def test_people_who_are_not_staff_get_a_403(fleet: object, alice_client: Client) -> None:
    assert alice_client.get(URL).status_code == 403
    assert f'href="{URL}"' not in alice_client.get(reverse("dashboard")).content.decode()


def test_staff_add_a_price_from_now_on(fleet: object, staff: User) -> None:
    answer = staff_client(staff).post(URL, a_price())
    assert answer.status_code == 302
    added = Price.objects.get(created_by=staff)
    assert str(added.per_hour) == "9.5000" and added.source == "new contract"
    assert added.effective_from <= database_now() + timedelta(seconds=1)


def test_a_price_with_too_many_decimals_is_refused_on_the_form(fleet: object, staff: User) -> None:
    answer = staff_client(staff).post(URL, a_price(per_hour="9.12345"))
    assert answer.status_code == 400
    assert "at most 4 decimals" in answer.content.decode()
    assert not Price.objects.filter(created_by=staff).exists()


def test_htmx_gets_the_price_area_back_with_the_refusal(hold: Hold, alice: User, staff: User) -> None:
    hold(alice, timedelta(minutes=5))
    past = (database_now() - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
    answer = staff_client(staff).post(URL, a_price(effective_from=past), HTTP_HX_REQUEST="true")
    text = answer.content.decode()
    assert answer.status_code == 200 and text.lstrip().startswith('<div id="price-area">')
    assert "allocated since" in text and not Price.objects.filter(created_by=staff).exists()


def test_the_admin_shows_the_ledger_and_lets_nobody_change_it(admin_client: Client, alice: User, staff: User) -> None:
    from billing import ledger

    granted = ledger.grant_credit(alice, "10", by=staff, reason="welcome")
    assert admin_client.get(reverse("admin:billing_ledgertransaction_changelist")).status_code == 200
    page = admin_client.get(reverse("admin:billing_ledgertransaction_change", args=[granted.pk]))
    assert page.status_code == 200 and "welcome" in page.content.decode()
    assert admin_client.post(reverse("admin:billing_entry_delete", args=[Entry.objects.first().pk])).status_code == 403  # type: ignore[union-attr]
    assert admin_client.get(reverse("admin:billing_price_add")).status_code == 200


def test_the_admin_refuses_a_price_that_would_reprice_a_running_holding_in_words(
    admin_client: Client, hold: Hold, alice: User
) -> None:
    hold(alice, timedelta(minutes=5))
    past = database_now() - timedelta(hours=1)
    form = {
        "model_name": "A100-SXM4-80GB",
        "kind": "whole",
        "profile": "",
        "market": "on_demand",
        "per_hour": "20",
        "effective_from_0": past.strftime("%Y-%m-%d"),
        "effective_from_1": past.strftime("%H:%M:%S"),
        "source": "backdated",
    }
    answer = admin_client.post(reverse("admin:billing_price_add"), form)
    assert answer.status_code == 200 and "allocated since" in answer.content.decode()
    assert not Price.objects.filter(source="backdated").exists()
