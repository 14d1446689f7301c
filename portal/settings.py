"""Django settings for the GPU portal.

Every value that differs between machines is read from the environment here
and nowhere else; the README's settings table lists each variable with its
default. A bad value stops start-up with a message that names the variable.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import zoneinfo
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from portal import entrylimits
from portal.datafiles import secret_file
from portal.env import Env
from portal.sso.keys import signing_key
from sessions.runtime import engine_config, network
from sessions.runtime.network import UserNetwork

django_stubs_ext.monkeypatch()
env = Env()
BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = env.path("PORTAL_DATA_DIR", BASE_DIR / "var")


def _secret_key() -> str:
    """Use PORTAL_SECRET_KEY, else a key generated once into the data directory."""
    given = env.text("PORTAL_SECRET_KEY", "")
    if given:
        if len(given) < 32:
            raise ImproperlyConfigured("PORTAL_SECRET_KEY must be at least 32 characters long.")
        return given
    return secret_file(DATA_DIR / "secret_key", lambda: secrets.token_urlsafe(50))


def _database() -> dict[str, object]:
    default = f"sqlite:///{DATA_DIR / 'portal.sqlite3'}"
    url = env.text("DATABASE_URL", default)
    try:
        config = dict(dj_database_url.parse(url, conn_max_age=0))
    except (ValueError, KeyError) as error:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL we understand: {error}") from None
    engine = str(config.get("ENGINE", ""))
    if not engine.endswith(("sqlite3", "postgresql")):
        raise ImproperlyConfigured("DATABASE_URL must start with sqlite:// or postgres://.")
    if engine.endswith("postgresql") and env.integer("PORTAL_DB_POOL_SIZE", 10, minimum=0):
        config["OPTIONS"] = {**config.get("OPTIONS", {}), "pool": _pool()}  # type: ignore[dict-item]
    if engine.endswith("postgresql") and env.flag("PORTAL_DB_PREPARED_STATEMENTS", True):
        # Only the allocator's statements (sessions.gpus.statements, server-side binding) can be prepared:
        # Django's own cursors bind on the client, which psycopg never prepares. From a statement's fifth use
        # on a connection, psycopg's default.
        config["OPTIONS"] = {**config.get("OPTIONS", {}), "prepare_threshold": 5}  # type: ignore[dict-item]
    if engine.endswith("sqlite3"):
        Path(str(config["NAME"])).parent.mkdir(parents=True, exist_ok=True)
        config["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
        # A file, not memory, so test helper processes (worker, daphne) share it.
        config["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
    return config


def _pool() -> dict[str, object]:
    """Each process borrows PostgreSQL connections from a pool (Django's own, psycopg_pool).

    Under ASGI every request and websocket handshake runs in a thread of its own: without a pool each
    opened its own connection, a storm of 500 sockets met PostgreSQL's max_connections ("too many
    clients") and the handshakes that queued behind connection set-ups timed out. Borrowers wait for a
    free connection, up to the timeout, instead.
    """
    return {
        "min_size": 1,
        "max_size": env.integer("PORTAL_DB_POOL_SIZE", 10, minimum=0),
        "timeout": env.integer("PORTAL_DB_POOL_TIMEOUT_SECONDS", 20, minimum=1),
    }


def _redis_url() -> str:
    url = env.text("REDIS_URL", "redis://127.0.0.1:6379/0")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"REDIS_URL must start with redis://, rediss:// or unix:// (got {url!r}).")
    return url


def _channel_layer_host(url: str) -> dict[str, object]:
    """A channels-redis host entry with redis-py connection settings.

    The core layer waits for messages in a blocking BZPOPMIN of 5 s; redis-py 8 gives up on any read after
    its socket timeout, also 5 s by default, and the consumer then closes with 1011. Reads must outlast
    the blocking pop. A connection idle for a while is checked with a PING before it is used again.
    """
    return {
        "address": url,
        "socket_timeout": 15,
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 30,
    }


def _time_zone() -> str:
    name = env.text("PORTAL_TIME_ZONE", "UTC")
    if name not in zoneinfo.available_timezones():
        raise ImproperlyConfigured(f"PORTAL_TIME_ZONE must be an IANA time zone such as Europe/Berlin (got {name!r}).")
    return name


SECRET_KEY = _secret_key()
DEBUG = env.flag("PORTAL_DEBUG", False)
ALLOWED_HOSTS = env.items("PORTAL_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.items("PORTAL_CSRF_TRUSTED_ORIGINS", [])
SIGNUP_ENABLED = env.flag("PORTAL_SIGNUP_ENABLED", False)
# Whom people without the 'users' role are told to ask for it (e.g. "gpu-admins@example.org").
ACCESS_CONTACT = env.text("PORTAL_ACCESS_CONTACT", "")
SITE_NAME = env.text("PORTAL_SITE_NAME", "GPU Portal")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "template_partials.apps.SimpleAppConfig",
    "axes",
    "oauth2_provider",
    "portal",
    # sessions/ by domain (README, "sessions/ by domain"): one app each, wired together by the last one.
    "sessions.gpus.apps.GpusConfig",
    "sessions.runtime.apps.RuntimeConfig",
    "sessions.metrics.apps.MetricsConfig",
    "sessions.storage.apps.StorageConfig",
    "sessions.notebooks.apps.NotebooksConfig",
    "sessions.render.apps.RenderConfig",
    "sessions.apps.GpuSessionsConfig",
    "billing",
    "csp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "OPTIONS": {
            # Named partials ({% partialdef %}) let a view render one region of a page for htmx.
            "loaders": [
                (
                    "template_partials.loader.Loader",
                    [
                        (
                            "django.template.loaders.cached.Loader",
                            [
                                "django.template.loaders.filesystem.Loader",
                                "django.template.loaders.app_directories.Loader",
                            ],
                        )
                    ],
                )
            ],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.portal",
            ],
            "builtins": ["template_partials.templatetags.partials"],
        },
    },
]

DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = _redis_url()
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env.text("PORTAL_CACHE_PREFIX", "portal"),
    }
}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [_channel_layer_host(REDIS_URL)],
            "prefix": env.text("PORTAL_CHANNEL_PREFIX", "portal"),
            "capacity": 500,
        },
    },
    # Live GPU metrics: Redis pub/sub, one message per group a tick, no per-channel queues in Redis.
    # It has no capacity limit, so the consumers drop stale frames themselves.
    "metrics": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [_channel_layer_host(REDIS_URL)],
            "prefix": env.text("PORTAL_CHANNEL_PREFIX", "portal") + "-metrics",
        },
    },
}

# The broker may be a Redis (or any broker Celery speaks) of its own; by default the one Redis.
CELERY_BROKER_URL = env.text("PORTAL_CELERY_BROKER_URL", "") or REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = env.text("PORTAL_CELERY_QUEUE", "portal")
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = False
# Render jobs' own queue (portal/celery.py routes the probe and the slices' workers there); empty: the
# default queue's name plus "-render", so a test run's or a second portal's queues stay apart.
RENDER_QUEUE = env.text("PORTAL_RENDER_QUEUE", "")
# Threads of the render worker (make run's supervisor starts it with as many): each follows one slice's chunks,
# and every person rendering gets an equal share of them (sessions/render/services.py, share_of_threads).
RENDER_THREADS = env.integer("PORTAL_RENDER_CONCURRENCY", os.cpu_count() or 1, minimum=1)
# Where render workers get a job's scene and give its frames back (sessions/render/filestore.py): "local", this
# machine's PORTAL_RENDER_DIR, or "portal", a GPU host's worker that does not share the portal's disk: it fetches
# from the portal at PORTAL_FILE_STORE_URL into PORTAL_RENDER_SCRATCH_DIR, each call signed with
# PORTAL_FILE_STORE_KEY, which the portal and its GPU hosts share (sessions/render/portalstore.py).
RENDER_FILE_STORE = env.choice("PORTAL_RENDER_FILE_STORE", "local", {"local": "local", "portal": "portal"})
FILE_STORE_URL = env.text("PORTAL_FILE_STORE_URL", "")
if FILE_STORE_URL and urlsplit(FILE_STORE_URL).hostname:  # the portal answers its GPU hosts at that address
    ALLOWED_HOSTS = [*ALLOWED_HOSTS, str(urlsplit(FILE_STORE_URL).hostname)]
# The hosts whose render queues this machine's render worker reads (sessions/render/queues.py); empty: its GPU
# agent's hosts, and with simulated GPUs every simulated host whose engine is this machine's.
RENDER_HOSTS = env.items("PORTAL_RENDER_HOSTS", [])
# Estimates' own queue (the probe), read by a worker of its own, so an upload is estimated while renders hold
# every render thread; empty: the default queue's name plus "-estimate".
ESTIMATE_QUEUE = env.text("PORTAL_ESTIMATE_QUEUE", "")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
PASSWORD_RESET_TIMEOUT = env.integer("PORTAL_PASSWORD_RESET_TIMEOUT", 3 * 3600, minimum=300)

# Failed-login throttling (django-axes): a username or an address that fails
# this many times in a row is locked out for the cool-off period.
AXES_FAILURE_LIMIT = env.integer("PORTAL_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env.integer("PORTAL_LOGIN_COOLOFF_MINUTES", 15, minimum=1) / 60
AXES_LOCKOUT_PARAMETERS = ["ip_address", "username"]
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_RESET_ON_SUCCESS = True
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
# Requests arrive through configurable-http-proxy: trust the addresses it appends (see portal/client_ip.py).
TRUSTED_PROXY_HOPS = env.integer("PORTAL_TRUSTED_PROXY_HOPS", 1, minimum=0)
AXES_CLIENT_IP_CALLABLE = "portal.client_ip.client_ip"
AXES_VERBOSE = False
AXES_SENSITIVE_PARAMETERS = ["password"]

EMAIL_BACKEND = env.choice(
    "PORTAL_EMAIL_BACKEND",
    "console",
    {
        "console": "django.core.mail.backends.console.EmailBackend",
        "smtp": "django.core.mail.backends.smtp.EmailBackend",
        "file": "django.core.mail.backends.filebased.EmailBackend",
        "memory": "django.core.mail.backends.locmem.EmailBackend",
    },
)
EMAIL_FILE_PATH = DATA_DIR / "mail"
EMAIL_HOST = env.text("PORTAL_EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = env.integer("PORTAL_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env.text("PORTAL_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env.text("PORTAL_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env.flag("PORTAL_EMAIL_USE_TLS", False)
# Seconds an SMTP connection may take: a mail server that does not answer must not hold up the beat task.
EMAIL_TIMEOUT = env.integer("PORTAL_EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env.text("PORTAL_DEFAULT_FROM_EMAIL", "portal@localhost")

LANGUAGE_CODE = "en"
TIME_ZONE = _time_zone()
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
MEDIA_ROOT = DATA_DIR / "media"

# Request bodies: forms stay small, a scene goes up in parts of at most RENDER_UPLOAD_PART_BYTES; the public
# entry (compose/hub/gate.mjs) refuses a larger body before daphne holds it, with these same numbers (and the
# same rate of upload starts as below).
ENTRY_LIMITS = entrylimits.from_environ(env.source)
DATA_UPLOAD_MAX_MEMORY_SIZE = ENTRY_LIMITS.form
RENDER_UPLOAD_PART_BYTES = ENTRY_LIMITS.upload_part
DATA_UPLOAD_MAX_NUMBER_FIELDS = 500

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
# Content-Security-Policy (django-csp): the pages load scripts, styles, images and websockets from the
# portal's own origin only, and no inline script, event handler, eval or style attribute runs. Whatever
# reaches a page from Redis or the database is escaped or set as text; this is the second line, should
# markup ever slip through. 'self' covers the same-origin ws:// and wss:// sockets (CSP level 3).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
# Behind TLS (anything but a developer's DEBUG run) cookies travel only over HTTPS.
SECURE_COOKIES = env.flag("PORTAL_SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
if env.flag("PORTAL_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# GPUs: which backend discovers and slices them, and the simulated fleet used
# where no NVIDIA driver answers.
GPU_BACKEND = env.choice("PORTAL_GPU_BACKEND", "auto", {name: name for name in ("auto", "nvml", "simulated")})
GPU_HOST_NAME = env.text("PORTAL_GPU_HOST_NAME", socket.gethostname())
SIMULATED_FLEET = env.text("PORTAL_SIMULATED_FLEET", "sim-1: 2xH200:mig, 1xA100-80GB:whole, 1xA30:shared=4")
# GPU hosts (sessions/gpus/hosts.py): the machine identity an agent beats with (default: /etc/machine-id, else
# the host name), how often it beats, after how long a silent host is lost (nothing placed there, nothing
# charged past its last heartbeat) and after how much longer its holdings end at that heartbeat.
GPU_NODE_ID = env.text("PORTAL_GPU_NODE_ID", "")
HOST_HEARTBEAT_S = env.integer("PORTAL_HOST_HEARTBEAT_S", 5, minimum=1)
HOST_LOST_AFTER_S = env.integer("PORTAL_HOST_LOST_AFTER_S", 30, minimum=3 * HOST_HEARTBEAT_S)
HOST_GIVE_UP_AFTER_S = env.integer("PORTAL_HOST_GIVE_UP_AFTER_S", 3600, minimum=60)
# How long a launch waits for its host's agent to make its MIG instance (sessions/gpus/orders.py); a host whose
# heartbeat is stale fails it at once.
HOST_ORDER_DEADLINE_S = env.integer("PORTAL_HOST_ORDER_DEADLINE_S", 30, minimum=1)
MAX_SLICES_PER_USER = env.integer("PORTAL_MAX_SLICES_PER_USER", 4, minimum=0)
# GPU containers: host resources per slice, process limit.
CPUS_PER_COMPUTE_SLICE = env.integer("PORTAL_CPUS_PER_COMPUTE_SLICE", 2, minimum=1)
HOST_MEMORY_PER_GPU_GIB = env.integer("PORTAL_HOST_MEMORY_PER_GPU_GIB", 1, minimum=1)
CONTAINER_PIDS_LIMIT = env.integer("PORTAL_CONTAINER_PIDS_LIMIT", 1024, minimum=16)
# A GPU container's output on the host's disk (the engine's json-file log): rotated at this size, this many
# files kept.
CONTAINER_LOG_MAX_BYTES = env.integer("PORTAL_CONTAINER_LOG_MAX_BYTES", 10 * 1024**2, minimum=64 * 1024)
CONTAINER_LOG_FILES = env.integer("PORTAL_CONTAINER_LOG_FILES", 3, minimum=1)
# Labels this portal's containers, so reconciliation never removes another portal's on the same engine.
INSTANCE_ID = env.text("PORTAL_INSTANCE_ID", "") or secret_file(DATA_DIR / "instance_id", lambda: secrets.token_hex(6))


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
# The Docker engine of each GPU host that is not this machine (sessions/runtime/engines.py): host=endpoint; ...
DOCKER_ENGINES = engine_config.parse(env.text("PORTAL_DOCKER_ENGINES", ""))
# Where a slice goes when GPUs of several hosts would serve it (sessions/gpus/packing.py): "pack" fills the
# busiest host first, keeping whole hosts free; "spread" the least busy.
PLACEMENT = env.choice("PORTAL_PLACEMENT", "pack", {"pack": "pack", "spread": "spread"})
# A Swarm manager's Docker endpoint, where the hub's Swarm spawner asks for services and the fleet pages read
# each host's node (sessions/runtime/swarm.py); empty: no Swarm.
SWARM_MANAGER = env.text("PORTAL_SWARM_MANAGER", "")


def _check_fleet() -> None:
    from sessions.gpus.backends.simulated import FleetSpecError, parse_fleet

    try:
        parse_fleet(SIMULATED_FLEET)
    except FleetSpecError as error:
        raise ImproperlyConfigured(f"PORTAL_SIMULATED_FLEET: {error}") from None


_check_fleet()

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
HUB_SERVICE_TOKEN = env.text("PORTAL_HUB_SERVICE_TOKEN", "") or secret_file(DATA_DIR / "hub_service_token")
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

# Live GPU metrics: how often the agent samples, how long per-minute history is kept, the bearer
# token Prometheus must send to /metrics (empty: /metrics is off), and open metric sockets per person.
METRICS_INTERVAL_MS = env.integer("PORTAL_METRICS_INTERVAL_MS", 1000, minimum=100)
METRICS_RETENTION_DAYS = env.integer("PORTAL_METRICS_RETENTION_DAYS", 30, minimum=1)
METRICS_TOKEN = env.text("PORTAL_METRICS_TOKEN", "")
METRICS_SOCKETS_PER_USER = env.integer("PORTAL_METRICS_SOCKETS_PER_USER", 20, minimum=1)

# Billing: an ended usage's minute rows are folded into one row per day this many days after its end.
BILLING_MINUTE_DAYS = env.integer("PORTAL_BILLING_MINUTE_DAYS", 3, minimum=1)

# Billing: the currency prices and the ledger are in (an ISO 4217 code; amounts show with two decimals).
CURRENCY = env.text("PORTAL_CURRENCY", "CNY").upper()
if not re.fullmatch(r"[A-Z]{3}", CURRENCY):
    raise ImproperlyConfigured(f"PORTAL_CURRENCY must be a three-letter currency code such as CNY (got {CURRENCY!r}).")
# A launch is refused unless the balance covers this many minutes of it and of what already runs (0: never
# refused for credit); at a zero balance people are warned and their sessions stop this many minutes later.
BILLING_MIN_MINUTES = env.integer("PORTAL_BILLING_MIN_MINUTES", 10, minimum=0)
BILLING_GRACE_MINUTES = env.integer("PORTAL_BILLING_GRACE_MINUTES", 5, minimum=0)

# Spot: how long a spot session's owner is told before its slice is reclaimed for an on-demand launch
# (a cloud's spot interruption notice; AWS gives two minutes).
SPOT_GRACE_SECONDS = env.integer("PORTAL_SPOT_GRACE_SECONDS", 120, minimum=0)

# Rendering: how often a failed chunk is tried in all, how long one chunk's or the probe's container may
# run, and the thumbnails' longest side in pixels.
RENDER_CHUNK_ATTEMPTS = env.integer("PORTAL_RENDER_CHUNK_ATTEMPTS", 3, minimum=1)
RENDER_CHUNK_WALL_SECONDS = env.integer("PORTAL_RENDER_CHUNK_WALL_SECONDS", 3600, minimum=10)
RENDER_PROBE_WALL_SECONDS = env.integer("PORTAL_RENDER_PROBE_WALL_SECONDS", 600, minimum=10)
# The estimate's probe renders a few of the job's frames as the job will; this bounds their sampling in all
# (shared among them, each frame stopped at its share, its samples left projected at the pace of those taken).
RENDER_PROBE_SAMPLING_SECONDS = env.integer("PORTAL_RENDER_PROBE_SAMPLING_SECONDS", 30, minimum=1)
RENDER_THUMBNAIL_PIXELS = env.integer("PORTAL_RENDER_THUMBNAIL_PIXELS", 320, minimum=16)
# The widest or tallest frame a job may render, in pixels (the scene's resolution at the job's percentage):
# a scene past it fails its estimate, and no frame larger is ever decoded for a thumbnail.
RENDER_MAX_RESOLUTION = env.integer("PORTAL_RENDER_MAX_RESOLUTION", 16384, minimum=16)
# What one chunk's run (or the probe) may write into its output folder, a host folder the sandbox writes:
# past it the container is stopped and the job fails, so a hostile scene cannot fill the host's disk.
RENDER_MAX_OUTPUT_BYTES = env.integer("PORTAL_RENDER_MAX_OUTPUT_BYTES", 20 * 1024**3, minimum=1024**2)

# Render jobs: where scenes and frames live (a folder per person, named by a keyed hash, and per job, named
# at random), and what an upload may be. The upload limit holds while the body streams to disk.
RENDER_DIR = env.path("PORTAL_RENDER_DIR", DATA_DIR / "render")
RENDER_SCRATCH_DIR = env.path("PORTAL_RENDER_SCRATCH_DIR", DATA_DIR / "render-scratch")


def _file_store_key() -> str:
    """PORTAL_FILE_STORE_KEY; on the portal's machine alone, else a key generated once into the data directory
    (a GPU host's worker must be given the portal's: it refuses to start without it)."""
    given = env.text("PORTAL_FILE_STORE_KEY", "")
    if given and len(given) < 32:
        raise ImproperlyConfigured("PORTAL_FILE_STORE_KEY must be at least 32 characters long.")
    if RENDER_FILE_STORE == "portal" and not (given and FILE_STORE_URL):
        raise ImproperlyConfigured(
            "PORTAL_RENDER_FILE_STORE=portal needs PORTAL_FILE_STORE_URL (the portal's address as this host reaches "
            "it) and PORTAL_FILE_STORE_KEY (the portal's own key)."
        )
    return given or secret_file(DATA_DIR / "file_store_key")


FILE_STORE_KEY = _file_store_key()
RENDER_MAX_UPLOAD_BYTES = env.integer("PORTAL_RENDER_MAX_UPLOAD_BYTES", 2 * 1024**3, minimum=1024)
RENDER_MAX_UNPACKED_BYTES = env.integer("PORTAL_RENDER_MAX_UNPACKED_BYTES", 8 * 1024**3, minimum=1024)
RENDER_MAX_ZIP_ENTRIES = env.integer("PORTAL_RENDER_MAX_ZIP_ENTRIES", 5000, minimum=1)
RENDER_MAX_FRAMES = env.integer("PORTAL_RENDER_MAX_FRAMES", 10000, minimum=1)
# A zip whose entries (any over 1 MiB, and all together) unpack to more than this many times what they take
# packed is refused from its directory, before anything is unpacked.
RENDER_MAX_COMPRESSION_RATIO = env.integer("PORTAL_RENDER_MAX_COMPRESSION_RATIO", 100, minimum=2)
# Per person: uploads begun in each window (past it: 429 with Retry-After), render jobs not yet ended (uploads on
# their way count), and how long an upload nobody adds to is kept before it is removed.
RENDER_UPLOADS_PER_WINDOW = ENTRY_LIMITS.uploads_per_window
RENDER_UPLOAD_WINDOW_MINUTES = ENTRY_LIMITS.upload_window_minutes
RENDER_MAX_OPEN_JOBS = env.integer("PORTAL_RENDER_MAX_OPEN_JOBS", 10, minimum=1)
RENDER_UPLOAD_EXPIRY_HOURS = env.integer("PORTAL_RENDER_UPLOAD_EXPIRY_HOURS", 24, minimum=1)
# Days an ended job keeps its files (scene, frames, thumbnails); an hourly task then removes them, keeping
# the job's record and every charge.
RENDER_RETENTION_DAYS = env.integer("PORTAL_RENDER_RETENTION_DAYS", 30, minimum=1)
# A job left waiting for its owner (its main file never chosen, its estimate never confirmed) is cancelled this
# many hours after it began to wait, and its files removed, by the hourly retention task.
RENDER_UNFINISHED_EXPIRY_HOURS = env.integer("PORTAL_RENDER_UNFINISHED_EXPIRY_HOURS", 48, minimum=1)

# Storage: what one person may keep on the portal's disk (render jobs' files, uploads on their way, the notebook
# work volume, notebook containers' own files) unless a group of theirs or they themselves have a quota set in
# the admin; and how often a periodic task measures it all again (each job is also measured as its files change).
STORAGE_QUOTA_BYTES = env.integer("PORTAL_STORAGE_QUOTA_BYTES", 50 * 1024**3, minimum=1024**2)
STORAGE_MEASURE_MINUTES = env.integer("PORTAL_STORAGE_MEASURE_MINUTES", 10, minimum=1)

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVEL = env.choice(
    "PORTAL_LOG_LEVEL", "INFO", {word: word.upper() for level in LOG_LEVELS for word in (level, level.lower())}
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.request": {"level": "WARNING"}},
}
