"""A usage is on the billing page from the moment its container started, before the meter's first tick has
opened it: in the running list and the history, its cost so far from its recorded moments; once the tick
has charged it, the same row shows what was charged, listed once."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from billing import meter
from billing.models import Usage
from tests.billing.conftest import A30_SHARE, H200_3G, Hold

pytestmark = pytest.mark.django_db
PAGE = reverse("billing-account")


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def history_of(user: User, **filters: str) -> str:
    """The history region alone, as htmx asks for it."""
    answer = client_of(user).get(PAGE, filters, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="history")
    return answer.content.decode()


def rows_of(history: str) -> list[str]:
    return re.findall(r'<tr data-testid="usage-row">(.*?)</tr>', history, re.S)


def test_a_usage_not_yet_ticked_is_in_the_history_and_the_running_list_at_once(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(minutes=2, seconds=10))  # three started minutes of an A100: 3 x 0.141667
    assert not Usage.objects.exists()  # the meter has not seen it
    [row] = rows_of(history_of(alice))
    assert "A100-SXM4-80GB" in row and "running" in row and "On-demand" in row
    assert "<td>3</td>" in row and "0.43 CNY" in row and 'data-testid="not-yet-charged"' in row
    page = client_of(alice).get(PAGE).content.decode()
    assert "Running now" in page and "3 started minutes" in page and "Nothing runs now" not in page
    assert 'data-testid="history-total">0.43 CNY' in page

    assert meter.tick().minutes == 3
    [row] = rows_of(history_of(alice))  # now the usage's row, and only that
    assert "<td>3</td>" in row and "0.43 CNY" in row and "not-yet-charged" not in row


def test_an_ended_usage_not_yet_ticked_shows_its_minutes_to_its_end(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(minutes=5), request=H200_3G, lasted=timedelta(minutes=1, seconds=1))
    [row] = rows_of(history_of(alice))
    assert "3g.71gb" in row and "<td>2</td>" in row and "running" not in row


def test_a_usage_not_yet_ticked_follows_the_filters_and_counts_in_the_days(hold: Hold, alice: User) -> None:
    hold(alice, timedelta(minutes=3), request=H200_3G, lasted=timedelta(minutes=2))
    meter.tick()
    hold(alice, timedelta(minutes=1), request=A30_SHARE)  # after the tick: not opened yet
    assert len(rows_of(history_of(alice))) == 2
    assert len(rows_of(history_of(alice, kind="mig"))) == 1
    [shared] = rows_of(history_of(alice, model="A30-24GB"))
    assert "not-yet-charged" in shared
    assert history_of(alice).count("<meter") == 1  # one day's bar holds both


def test_someone_elses_usage_not_yet_ticked_is_not_shown(hold: Hold, alice: User, bob: User) -> None:
    hold(bob, timedelta(minutes=1))
    assert rows_of(history_of(alice)) == []
