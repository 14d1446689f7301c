"""Django settings for the GPU portal: Django's own wiring (apps, database, Redis, Celery, sign-in, mail, static
files, request limits, security headers, logging), then each domain's settings from portal/conf/.

Every value that differs between machines is read from the environment, here or in portal/conf/, and nowhere
else; the README's settings table lists each variable with its default. A bad value stops start-up with a
message that names the variable.
"""

from __future__ import annotations

import secrets
import zoneinfo
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from portal import entrylimits
from portal.conf.base import BASE_DIR, DATA_DIR, env
from portal.datafiles import secret_file

django_stubs_ext.monkeypatch()


def _secret_key() -> str:
    """Use PORTAL_SECRET_KEY, else a key generated once into the data directory."""
    given = env.text("PORTAL_SECRET_KEY", "")
    if given:
        if len(given) < 32:
            raise ImproperlyConfigured("PORTAL_SECRET_KEY must be at least 32 characters long.")
        return given
    return secret_file(DATA_DIR / "secret_key", lambda: secrets.token_urlsafe(50), "PORTAL_SECRET_KEY")


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
        config["CONN_HEALTH_CHECKS"] = True  # with the pool: psycopg_pool checks each connection as it is lent
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

    Each connection is checked as it is lent (CONN_HEALTH_CHECKS: an empty round trip): after PostgreSQL
    restarts, every pooled connection is dead, and unchecked, each was lent once more and failed its request
    with a 500 (the deployment's smoke test, tests/deploy, kills PostgreSQL under a running portal).
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
STATIC_ROOT = env.path("PORTAL_STATIC_ROOT", DATA_DIR / "static")
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
# Per person: render uploads begun in each window (past it: 429 with Retry-After).
RENDER_UPLOADS_PER_WINDOW = ENTRY_LIMITS.uploads_per_window
RENDER_UPLOAD_WINDOW_MINUTES = ENTRY_LIMITS.upload_window_minutes
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

# Each domain's settings, in a module of its own (portal/conf/); Django and mypy find them here. None of them
# imports this file, so they are read after everything above.
from portal.conf.billing import *
from portal.conf.gpus import *
from portal.conf.notebooks import *
from portal.conf.render import *
from portal.conf.render import FILE_STORE_URL

if FILE_STORE_URL and urlsplit(FILE_STORE_URL).hostname:  # the portal answers its GPU hosts at that address
    ALLOWED_HOSTS = [*ALLOWED_HOSTS, str(urlsplit(FILE_STORE_URL).hostname)]
