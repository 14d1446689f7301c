"""What the portal tells JupyterHub about a person: their user name and whether they are staff."""

from __future__ import annotations

from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


class PortalOAuth2Validator(OAuth2Validator):
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "preferred_username": "profile", "is_staff": "profile"}

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {
            "preferred_username": user.get_username(),
            "name": user.get_full_name() or user.get_username(),
            "email": user.email,
            "is_staff": bool(user.is_staff),
        }
