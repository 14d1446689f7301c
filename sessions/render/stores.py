"""The file store this process's render work uses (PORTAL_RENDER_FILE_STORE): the local disk
(``sessions.render.filestore``), where the render worker runs on the portal's machine, or the portal itself,
fetched from over the network (``sessions.render.portalstore``), on a GPU host of its own."""

from __future__ import annotations

import threading

from django.conf import settings

from sessions.render.filestore import LOCAL, PORTAL, LocalStore

_stores: dict[str, LocalStore] = {}
_lock = threading.Lock()


def current() -> LocalStore:
    """One store per process and setting (a test may switch the setting)."""
    with _lock:
        if settings.RENDER_FILE_STORE not in _stores:
            if settings.RENDER_FILE_STORE == PORTAL:
                from sessions.render.portalstore import PortalStore  # requests is loaded only where it is used

                _stores[PORTAL] = PortalStore()
            else:
                _stores[LOCAL] = LocalStore()
        return _stores[settings.RENDER_FILE_STORE]
