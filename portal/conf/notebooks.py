"""Notebook sessions' settings: the network their containers run on, the JupyterHub that serves them (the portal
is the OpenID provider it signs people in through, and drives it over its REST API), how many a person may run
and when an idle one stops. portal/settings.py imports them."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from portal.conf.base import DATA_DIR, env
from portal.datafiles import secret_file
from portal.sso.keys import signing_key
from sessions.runtime import network
from sessions.runtime.network import UserNetwork


def _user_network() -> UserNetwork:
    """The bridge notebook containers run on (sessions/runtime/network.py), or 'host' (unsafe, development)."""
    try:
        return network.parse(
            env.text("PORTAL_NOTEBOOK_NETWORK", network.DEFAULT_NAME),
            env.text("PORTAL_NOTEBOOK_SUBNET", network.DEFAULT_SUBNET),
            env.flag("PORTAL_NOTEBOOK_INTERNET", True),
            env.integer("PORTAL_HUB_PORT", network.DEFAULT_HUB_PORT, minimum=1),
            env.text("PORTAL_NOTEBOOK_BLOCKED_RANGES", ""),
        )
    except network.NetworkSpecError as error:
        raise ImproperlyConfigured(str(error)) from None


USER_NETWORK = _user_network()

# Single sign-on: the portal is the OpenID provider JupyterHub logs people in through.
PUBLIC_URL = env.text("PORTAL_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
if not PUBLIC_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(f"PORTAL_PUBLIC_URL must start with http:// or https:// (got {PUBLIC_URL!r}).")
HUB_OAUTH_CALLBACK_URL = env.text("PORTAL_HUB_OAUTH_CALLBACK_URL", f"{PUBLIC_URL}/jupyter/hub/oauth_callback")
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    # Fixed, not taken from each request's Host: the hub also calls the portal directly.
    "OIDC_ISS_ENDPOINT": f"{PUBLIC_URL}/o",
    "OIDC_RSA_PRIVATE_KEY": signing_key(DATA_DIR, env.text("PORTAL_OIDC_RSA_PRIVATE_KEY", "")),
    "OAUTH2_VALIDATOR_CLASS": "portal.sso.validators.PortalOAuth2Validator",
    "SCOPES": {"openid": "Sign you in", "profile": "Your user name and name"},
    "PKCE_REQUIRED": True,
    "ACCESS_TOKEN_EXPIRE_SECONDS": 3600,
}

# JupyterHub: where the portal reaches its REST API, and the token it shares with the hub
# (the portal's service token there, and what the spawner shows the portal's internal API).
# The hub listens on the user network's gateway (where notebook servers reach it), so the portal calls it there.
HUB_API_URL = env.text("PORTAL_HUB_API_URL", f"{USER_NETWORK.hub_url}/jupyter/hub/api")
HUB_SERVICE_TOKEN = env.text("PORTAL_HUB_SERVICE_TOKEN", "") or secret_file(
    DATA_DIR / "hub_service_token", variable="PORTAL_HUB_SERVICE_TOKEN"
)
MAX_SESSIONS_PER_USER = env.integer("PORTAL_MAX_SESSIONS_PER_USER", 3, minimum=1)
# A start keeps asking a hub that does not answer (restarting, say) for this long before it gives up,
# and a launch step that takes longer than the second figure is flagged on the session's card.
HUB_START_PATIENCE_SECONDS = env.integer("PORTAL_HUB_START_PATIENCE_SECONDS", 300, minimum=10)
SLOW_STEP_SECONDS = env.integer("PORTAL_SLOW_STEP_SECONDS", 60, minimum=5)
# Idle culling: minutes without activity before a session stops (per profile or kind, else the default),
# the warning shown before, and the longest any session may run.
IDLE_TIMEOUT_MINUTES = env.integer("PORTAL_IDLE_TIMEOUT_MINUTES", 30, minimum=1)
IDLE_TIMEOUTS = env.minutes_map("PORTAL_IDLE_TIMEOUTS", {"whole": 20, "7g.141gb": 20, "7g.80gb": 20})
IDLE_WARNING_MINUTES = env.integer("PORTAL_IDLE_WARNING_MINUTES", 5, minimum=1)
MAX_SESSION_HOURS = env.integer("PORTAL_MAX_SESSION_HOURS", 24, minimum=1)
# A minute in which a session's GPU utilisation reached this counts as activity for idle culling.
IDLE_GPU_UTIL_PERCENT = env.integer("PORTAL_IDLE_GPU_UTIL_PERCENT", 5, minimum=1)
