"""The run command's first administrator."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def bootstrap(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for name in ("PORTAL_ADMIN_USERNAME", "PORTAL_ADMIN_EMAIL", "PORTAL_ADMIN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    call_command("bootstrap_admin", stdout=out)
    return out.getvalue()


def test_it_creates_the_admin_from_the_environment(monkeypatch: pytest.MonkeyPatch, roles: None) -> None:
    output = bootstrap(monkeypatch, PORTAL_ADMIN_USERNAME="root", PORTAL_ADMIN_PASSWORD="given passphrase 99")
    admin = User.objects.get(username="root")
    assert admin.is_superuser and admin.is_staff
    assert admin.check_password("given passphrase 99")
    assert "given passphrase 99" not in output
    assert set(admin.groups.values_list("name", flat=True)) == {"users", "operators"}


def test_it_generates_and_prints_a_password_once(monkeypatch: pytest.MonkeyPatch, roles: None) -> None:
    output = bootstrap(monkeypatch)
    password = output.split("its password is ")[1].split()[0]
    assert User.objects.get(username="admin").check_password(password)
    again = bootstrap(monkeypatch)
    assert "already exists" in again
    assert "password" not in again


def test_the_password_is_taken_as_given_and_the_names_trimmed(monkeypatch: pytest.MonkeyPatch, roles: None) -> None:
    bootstrap(monkeypatch, PORTAL_ADMIN_USERNAME=" root\n", PORTAL_ADMIN_PASSWORD=" spaced passphrase 99 ")
    admin = User.objects.get(username="root")
    assert admin.check_password(" spaced passphrase 99 ")
    assert admin.email == "admin@localhost"
