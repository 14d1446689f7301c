# JupyterHub for the GPU portal: reached through configurable-http-proxy under /jupyter/,
# people log in through the portal (OpenID), servers start through our spawner.
# Every address and secret comes from the environment the run command (or a test) sets.
# A bad value stops the hub with a message naming the variable, as it stops the portal (portal/env.py).
import os
from pathlib import Path

from portal import entrylimits
from portal.env import Env
from sessions.runtime.network import from_environ

c = get_config()  # type: ignore[name-defined]  # noqa: F821

env = Env()
ROOT = Path(__file__).resolve().parents[2]
DATA = env.path("PORTAL_DATA_DIR", ROOT / "var")
HUB_DATA = env.path("PORTAL_HUB_DATA_DIR", DATA / "hub")
HUB_DATA.mkdir(parents=True, exist_ok=True)
PUBLIC = env.text("PORTAL_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
PORTAL = env.text("PORTAL_INTERNAL_URL", "http://127.0.0.1:8002").rstrip("/")  # daphne, behind the proxy
# The notebook servers' network: the hub listens on its gateway, the one address of ours they may reach.
NETWORK = from_environ(os.environ)
PROXY_API_PORT = env.integer("PORTAL_PROXY_API_PORT", 8001, minimum=1)
SERVICE_TOKEN = env.text("PORTAL_HUB_SERVICE_TOKEN", "") or (DATA / "hub_service_token").read_text().strip()

# Where notebook servers reach the hub: the user network's gateway on one host; across a Swarm, an address of
# the hub's machine that every GPU host routes to (PORTAL_HUB_BIND_URL).
HUB_URL = env.text("PORTAL_HUB_BIND_URL", NETWORK.hub_url).rstrip("/")
# docker: each notebook a container on its host's engine; swarm: a service pinned to its host's Swarm node;
# kube: a pod on its host's Kubernetes node (Zero to JupyterHub's values set it: compose/kubernetes/).
SPAWNER = env.choice(
    "PORTAL_HUB_SPAWNER",
    "docker",
    {
        "docker": "sessions.notebooks.spawner.PortalSpawner",
        "swarm": "sessions.notebooks.spawner.PortalSwarmSpawner",
        "kube": "sessions.notebooks.kubespawner.PortalKubeSpawner",
    },
)

c.JupyterHub.bind_url = f"{PUBLIC}/jupyter/"
c.JupyterHub.hub_bind_url = HUB_URL
c.JupyterHub.hub_connect_url = HUB_URL
c.JupyterHub.db_url = f"sqlite:///{HUB_DATA / 'jupyterhub.sqlite'}"
# A newer JupyterHub (an upgraded image) brings its database's schema up at start, after a copy of the file.
c.JupyterHub.upgrade_db = True
c.JupyterHub.cookie_secret_file = str(HUB_DATA / "cookie_secret")
c.JupyterHub.pid_file = str(HUB_DATA / "jupyterhub.pid")
c.JupyterHub.redirect_to_server = False
c.JupyterHub.allow_named_servers = True
# The portal enforces its own per-person limits; the hub's would count servers the portal has forgotten.
c.JupyterHub.named_server_limit_per_user = 0
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
c.JupyterHub.cleanup_servers = False  # a hub restart must not stop running sessions
# The hub's own home and "not running" pages send people to the portal, where sessions start.
c.JupyterHub.template_paths = [str(ROOT / "compose/hub/templates")]
c.JupyterHub.template_vars = {"portal_sessions_url": f"{PUBLIC}/sessions/"}

c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PROXY_API_PORT}"
# configurable-http-proxy with the gate on request bodies the portal's own entry uses (compose/hub/gate.mjs).
c.ConfigurableHTTPProxy.command = [
    str(ROOT / "compose/hub/gate.mjs"),
    "--default-target",
    PORTAL,
    *entrylimits.from_environ(os.environ).gate_arguments(),
]
# make run supervises the proxy as a program of its own (compose/hub/proxy.py, same token file), so a hub
# crash leaves the public address up; the tests' hub starts it itself. A proxy that restarts comes back
# without routes: the hub puts them back whenever it reads activity from the proxy, every 10 s here.
if not env.flag("PORTAL_HUB_STARTS_PROXY", True):
    from portal.datafiles import secret_file

    c.ConfigurableHTTPProxy.should_start = False
    c.ConfigurableHTTPProxy.auth_token = env.text("CONFIGPROXY_AUTH_TOKEN", "") or secret_file(
        DATA / "proxy_auth_token", variable="CONFIGPROXY_AUTH_TOKEN"
    )
    c.JupyterHub.last_activity_interval = 10
else:
    c.ConfigurableHTTPProxy.should_start = True

c.JupyterHub.authenticator_class = "generic-oauth"
c.GenericOAuthenticator.client_id = "jupyterhub"
# The portal's register_hub_client writes it into the data folder; containers are given it (compose/).
c.GenericOAuthenticator.client_secret = (
    env.secret("PORTAL_HUB_OAUTH_SECRET").strip() or (DATA / "hub_oauth_secret").read_text().strip()
)
c.GenericOAuthenticator.oauth_callback_url = f"{PUBLIC}/jupyter/hub/oauth_callback"
c.GenericOAuthenticator.authorize_url = f"{PUBLIC}/o/authorize/"
c.GenericOAuthenticator.token_url = f"{PORTAL}/o/token/"
c.GenericOAuthenticator.userdata_url = f"{PORTAL}/o/userinfo/"
c.GenericOAuthenticator.username_claim = "preferred_username"
c.GenericOAuthenticator.scope = ["openid", "profile"]
c.GenericOAuthenticator.login_service = "the GPU portal"
c.GenericOAuthenticator.allow_all = True
c.GenericOAuthenticator.auto_login = True
c.GenericOAuthenticator.auth_state_groups_key = lambda state: ["staff"] if state["oauth_user"].get("is_staff") else []
c.GenericOAuthenticator.admin_groups = {"staff"}
c.GenericOAuthenticator.manage_groups = True
c.GenericOAuthenticator.logout_redirect_url = f"{PUBLIC}/accounts/logout/"

c.JupyterHub.services = [{"name": "portal", "api_token": SERVICE_TOKEN}]
c.JupyterHub.load_roles = [
    {
        "name": "portal",
        "description": "Create people in the hub and start, stop and read their servers",
        "scopes": ["admin:users", "servers", "read:users:activity"],
        "services": ["portal"],
    }
]

c.JupyterHub.spawner_class = SPAWNER
c.PortalSwarmSpawner.swarm_manager = env.text("PORTAL_SWARM_MANAGER", "")  # empty: the hub's own engine
c.PortalSpawner.portal_url = c.PortalKubeSpawner.portal_url = PORTAL
c.PortalSpawner.engine_tls_dir = env.text("PORTAL_DOCKER_TLS_DIR", "")  # for a GPU host's tcp:// engine
c.PortalSpawner.portal_token = c.PortalKubeSpawner.portal_token = SERVICE_TOKEN
c.PortalSpawner.image = "gpu-portal/notebook:latest"
c.PortalSpawner.pull_policy = "never"
c.PortalSpawner.name_template = "gpu-portal-{username}-{servername}"
c.PortalSpawner.start_timeout = 120
c.PortalSpawner.http_timeout = 60
c.PortalSpawner.debug = False
