"""Registering JupyterHub as an OAuth client of the portal, without anyone clicking in the admin.

The hub needs the client secret in plain text, but the portal stores secrets
hashed: so the plain secret is written once into the data directory for the
hub to read, and the application row is updated to match it.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from oauth2_provider.models import get_application_model

from portal.datafiles import secret_file
from portal.env import Env

HUB_CLIENT_ID = "jupyterhub"


def hub_secret_path() -> Path:
    return Path(settings.DATA_DIR) / "hub_oauth_secret"


def register_hub_client() -> tuple[str, str]:
    """Create or update the hub's application; returns (client id, plain secret)."""
    secret = Env().secret("PORTAL_HUB_OAUTH_SECRET").strip() or secret_file(
        hub_secret_path(), variable="PORTAL_HUB_OAUTH_SECRET"
    )
    Application = get_application_model()
    application = Application.objects.filter(client_id=HUB_CLIENT_ID).first() or Application(client_id=HUB_CLIENT_ID)
    application.name = "JupyterHub"
    application.client_type = Application.CLIENT_CONFIDENTIAL
    application.authorization_grant_type = Application.GRANT_AUTHORIZATION_CODE
    application.redirect_uris = settings.HUB_OAUTH_CALLBACK_URL
    application.skip_authorization = True
    application.algorithm = Application.RS256_ALGORITHM
    application.client_secret = secret  # hashed on save
    application.save()
    return HUB_CLIENT_ID, secret
