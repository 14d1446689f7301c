"""Failed logins are throttled per username and per address."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


def attempt(username: str, password: str, address: str = "127.0.0.1"):  # type: ignore[no-untyped-def]
    return Client(REMOTE_ADDR=address).post(reverse("login"), {"username": username, "password": password})


def test_five_failures_lock_the_username_even_for_the_right_password(alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    for number in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt("alice", f"guess {number}", address=f"127.0.0.{number + 10}").status_code == 200
    assert attempt("alice", "last guess", address="127.0.0.20").status_code == 429
    locked = attempt("alice", PASSWORD, address="127.0.1.1")
    assert locked.status_code == 429
    assert "Too many failed log-ins" in locked.content.decode()


def test_failures_from_one_address_lock_that_address_for_every_username(alice: User, bob: User) -> None:
    for number in range(5):
        attempt(f"someone{number}", "guess", address="127.0.2.9")
    assert attempt("bob", PASSWORD, address="127.0.2.9").status_code == 429
    assert attempt("bob", PASSWORD, address="127.0.2.10").status_code == 302


def test_a_success_before_the_limit_clears_the_count(alice: User) -> None:
    for _ in range(4):
        attempt("alice", "guess")
    assert attempt("alice", PASSWORD).status_code == 302
    for _ in range(4):
        assert attempt("alice", "guess").status_code == 200
    assert attempt("alice", PASSWORD).status_code == 302


def test_the_lockout_page_does_not_echo_the_password(alice: User) -> None:
    for _ in range(5):
        attempt("alice", "s3cret-guess")
    page = attempt("alice", "s3cret-guess").content.decode()
    assert "s3cret-guess" not in page


def test_behind_the_proxy_the_forwarded_address_is_throttled_not_the_proxys(alice: User, bob: User) -> None:
    def via_proxy(client_address: str, username: str, password: str):  # type: ignore[no-untyped-def]
        client = Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=f"127.9.9.9, {client_address}")
        return client.post(reverse("login"), {"username": username, "password": password})

    for number in range(5):
        via_proxy("127.0.3.1", f"nobody{number}", "guess")
    assert via_proxy("127.0.3.1", "bob", PASSWORD).status_code == 429
    assert via_proxy("127.0.3.2", "bob", PASSWORD).status_code == 302
