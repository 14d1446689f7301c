"""Browser login: log in, log out, change and reset the password."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse

from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


def log_in(client: Client, username: str, password: str):  # type: ignore[no-untyped-def]
    return client.post(reverse("login"), {"username": username, "password": password})


def test_the_dashboard_sends_anonymous_visitors_to_the_login_page(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/"


def test_the_login_page_labels_its_fields(client: Client) -> None:
    page = client.get(reverse("login")).content.decode()
    assert '<label for="id_username">' in page
    assert '<label for="id_password">' in page
    assert "<h1>Log in</h1>" in page
    assert '<a class="brand" href="/">GPU Portal</a>' in page


def test_it_logs_in_with_the_right_password(client: Client, alice: User) -> None:
    response = log_in(client, "alice", PASSWORD)
    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard")
    assert client.get("/").status_code == 200


def test_it_refuses_a_wrong_password_with_a_clear_message(client: Client, alice: User) -> None:
    response = log_in(client, "alice", "not the password")
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()
    assert "_auth_user_id" not in client.session
    assert "not the password" not in response.content.decode()


def test_it_follows_next_after_login_but_not_off_site(client: Client, alice: User) -> None:
    response = client.post(
        reverse("login"), {"username": "alice", "password": PASSWORD, "next": "https://evil.example/"}
    )
    assert response["Location"] == reverse("dashboard")


def test_logout_needs_a_post_and_ends_the_session(alice_client: Client) -> None:
    assert alice_client.get(reverse("logout")).status_code == 405
    response = alice_client.post(reverse("logout"))
    assert response.status_code == 302
    assert alice_client.get("/").status_code == 302


def test_changing_the_password_keeps_this_browser_logged_in(alice_client: Client, alice: User) -> None:
    new = "a brand new passphrase 42"
    response = alice_client.post(
        reverse("password_change"),
        {"old_password": PASSWORD, "new_password1": new, "new_password2": new},
    )
    assert response["Location"] == reverse("password_change_done")
    assert alice_client.get("/").status_code == 200
    alice.refresh_from_db()
    assert alice.check_password(new)


def test_changing_the_password_needs_the_old_one(alice_client: Client, alice: User) -> None:
    new = "a brand new passphrase 42"
    response = alice_client.post(
        reverse("password_change"), {"old_password": "wrong", "new_password1": new, "new_password2": new}
    )
    assert response.status_code == 200
    assert "Your old password was entered incorrectly" in response.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


def reset_link(client: Client, email: str) -> str:
    client.post(reverse("password_reset"), {"email": email})
    assert len(mail.outbox) == 1
    match = re.search(r"http://testserver(/accounts/reset/\S+/)", str(mail.outbox[0].body))
    assert match, mail.outbox[0].body
    return match.group(1)


def test_a_password_reset_link_sets_a_new_password_once(client: Client, alice: User) -> None:
    link = reset_link(client, "alice@example.org")
    assert "GPU Portal" in mail.outbox[0].subject
    form_url = client.get(link)["Location"]
    new = "reset passphrase 2026"
    response = client.post(form_url, {"new_password1": new, "new_password2": new})
    assert response["Location"] == reverse("password_reset_complete")
    alice.refresh_from_db()
    assert alice.check_password(new)
    again = Client().get(link, follow=True)
    assert "This link no longer works" in again.content.decode()


def test_a_tampered_reset_link_is_refused(client: Client, alice: User) -> None:
    link = reset_link(client, "alice@example.org")
    forged = re.sub(r"/[^/]+/$", "/abcdef-0123456789abcdef0123456789abcdef/", link)
    response = client.get(forged, follow=True)
    assert "This link no longer works" in response.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


def test_a_reset_for_an_unknown_address_looks_the_same_and_sends_nothing(client: Client, alice: User) -> None:
    response = client.post(reverse("password_reset"), {"email": "nobody@example.org"})
    assert response["Location"] == reverse("password_reset_done")
    assert mail.outbox == []


def test_sign_up_is_off_by_default(client: Client) -> None:
    assert client.get(reverse("signup")).status_code == 404
    assert "Sign up" not in client.get(reverse("login")).content.decode()


def test_sign_up_when_switched_on_creates_a_user_in_the_users_group(client: Client, settings, roles) -> None:  # type: ignore[no-untyped-def]
    settings.SIGNUP_ENABLED = True
    pw = "quite a long passphrase 7"
    response = client.post(
        reverse("signup"), {"username": "erin", "email": "Erin@Example.org", "password1": pw, "password2": pw}
    )
    assert response["Location"] == reverse("dashboard")
    erin = User.objects.get(username="erin")
    assert erin.email == "erin@example.org"
    assert list(erin.groups.values_list("name", flat=True)) == ["users"]
    assert not erin.is_staff


def test_sign_up_refuses_a_taken_email_address(client: Client, settings, alice: User) -> None:  # type: ignore[no-untyped-def]
    settings.SIGNUP_ENABLED = True
    pw = "quite a long passphrase 7"
    response = client.post(
        reverse("signup"), {"username": "mallory", "email": "ALICE@example.org", "password1": pw, "password2": pw}
    )
    assert response.status_code == 200
    assert "already exists" in response.content.decode()
    assert not User.objects.filter(username="mallory").exists()
