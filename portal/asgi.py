"""ASGI entry point: Django for HTTP, Channels for websockets (daphne serves both)."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from portal.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Hundreds of open websockets make every full garbage collection long enough to show as
# a delay in the live charts. What was loaded at start-up never needs scanning again, and
# young objects may pile up longer before a collection (measured: python -m bench metrics).
gc.collect()
gc.freeze()
gc.set_threshold(20_000, 20, 50)
