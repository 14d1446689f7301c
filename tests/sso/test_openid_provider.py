"""The portal as an OpenID provider: the authorization-code flow with PKCE that JupyterHub uses."""

from __future__ import annotations

import base64
import hashlib
import secrets
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from portal.sso.clients import HUB_CLIENT_ID, register_hub_client

pytestmark = pytest.mark.django_db


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def authorize(client: Client, challenge: str, redirect_uri: str | None = None):  # type: ignore[no-untyped-def]
    query = {
        "response_type": "code",
        "client_id": HUB_CLIENT_ID,
        "redirect_uri": redirect_uri or settings.HUB_OAUTH_CALLBACK_URL,
        "scope": "openid profile",
        "state": "xyz",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    return client.get("/o/authorize/?" + urlencode(query))


def exchange(client: Client, secret: str, verifier_override: str | None = None):  # type: ignore[no-untyped-def]
    verifier, challenge = pkce()
    response = authorize(client, challenge)
    assert response.status_code == 302
    location = urlsplit(response["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == settings.HUB_OAUTH_CALLBACK_URL
    code = parse_qs(location.query)["code"][0]
    tokens = Client().post(
        "/o/token/",
        {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": settings.HUB_OAUTH_CALLBACK_URL,
            "client_id": HUB_CLIENT_ID,
            "client_secret": secret,
            "code_verifier": verifier_override or verifier,
        },
    )
    return tokens


def log_in_through_sso(client: Client, secret: str) -> dict[str, str]:
    tokens = exchange(client, secret)
    assert tokens.status_code == 200, tokens.content
    return dict(tokens.json())


def test_a_logged_in_user_gets_tokens_and_their_user_name_without_a_second_login(alice: User) -> None:
    _, secret = register_hub_client()
    client = Client()
    client.force_login(alice)
    tokens = log_in_through_sso(client, secret)
    claims = jwt.decode(tokens["id_token"], options={"verify_signature": False})
    assert claims["iss"] == f"{settings.PUBLIC_URL}/o"
    assert claims["aud"] == HUB_CLIENT_ID
    info = Client().get("/o/userinfo/", HTTP_AUTHORIZATION=f"Bearer {tokens['access_token']}").json()
    assert info["preferred_username"] == "alice"
    assert info["is_staff"] is False


def test_staff_status_reaches_the_hub(staff: User) -> None:
    _, secret = register_hub_client()
    client = Client()
    client.force_login(staff)
    tokens = log_in_through_sso(client, secret)
    info = Client().get("/o/userinfo/", HTTP_AUTHORIZATION=f"Bearer {tokens['access_token']}").json()
    assert info["preferred_username"] == "charlie"
    assert info["is_staff"] is True


def test_someone_not_logged_in_is_sent_to_the_portals_login(client: Client) -> None:
    register_hub_client()
    response = authorize(client, pkce()[1])
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/o/authorize/")


def test_a_wrong_secret_or_verifier_gets_no_tokens(alice: User) -> None:
    register_hub_client()
    client = Client()
    client.force_login(alice)
    wrong_secret = exchange(client, "not-the-secret")
    assert wrong_secret.status_code == 401
    assert "access_token" not in wrong_secret.json()
    _, secret = register_hub_client()
    wrong_verifier = exchange(client, secret, verifier_override=secrets.token_urlsafe(48))
    assert wrong_verifier.status_code == 400
    assert wrong_verifier.json()["error"] == "invalid_grant"


def test_a_foreign_redirect_uri_is_refused(alice: User) -> None:
    register_hub_client()
    client = Client()
    client.force_login(alice)
    response = authorize(client, pkce()[1], redirect_uri="http://127.0.0.1:9/steal")
    assert response.status_code == 400


def test_registering_twice_keeps_one_client_and_the_same_secret(db: None) -> None:
    from oauth2_provider.models import get_application_model

    first = register_hub_client()
    second = register_hub_client()
    assert first == second
    assert get_application_model().objects.filter(client_id=HUB_CLIENT_ID).count() == 1
