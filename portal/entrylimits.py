"""What the public entry lets through to the portal, read from the environment in one place: how large a request
body, and how many scene uploads one session begins in a while.

The public entry (compose/hub/gate.mjs, configurable-http-proxy used as a library) refuses a body past its
limit before the portal reads it, because daphne holds a whole body in memory before any view runs; and it
answers a flood of upload starts with 429 itself, before each costs daphne a request (the portal counts the
same limit per person, sessions/render/limits.py, which stays the rule).
portal/settings.py takes the portal's own limits from here; the two launchers of the entry (compose/hub/proxy.py
under make run, the hub's configuration in tests) pass all of them to it as arguments. Django is not loaded
where the launchers run, so this module imports only portal.env.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from portal.env import Env

KiB, MiB = 1024, 1024 * 1024
# The route scene uploads send their parts to (sessions/render/urls.py names it; a test checks they agree).
UPLOAD_PATH = "/sessions/render-jobs/uploads/"
# Django's session cookie: a body without it is anonymous, and is held to the smallest limit.
SESSION_COOKIE = "sessionid"


@dataclass(frozen=True)
class BodyLimits:
    anonymous: int  # to the portal without a session cookie: log-in and password-reset forms
    form: int  # to the portal with a session cookie: every form
    upload_part: int  # one part of a resumable scene upload, on UPLOAD_PATH
    jupyter: int  # to JupyterHub and the notebook servers (JupyterLab uploads files in parts of ~1 MiB)
    portal_bodies_at_once: int  # bodies over the anonymous limit on their way to the portal at once
    uploads_per_window: int  # scene uploads one person (at the entry: one session cookie) begins per window
    upload_window_minutes: int

    @property
    def upload_route(self) -> int:
        return max(self.form, self.upload_part)

    def gate_arguments(self) -> list[str]:
        """The gate's command-line arguments for these limits."""
        return [
            f"--anonymous-body-bytes={self.anonymous}",
            f"--portal-body-bytes={self.form}",
            f"--upload-body-bytes={self.upload_route}",
            f"--upload-path={UPLOAD_PATH}",
            f"--jupyter-body-bytes={self.jupyter}",
            f"--portal-bodies-at-once={self.portal_bodies_at_once}",
            f"--session-cookie={SESSION_COOKIE}",
            f"--upload-starts-per-window={self.uploads_per_window}",
            f"--upload-window-seconds={self.upload_window_minutes * 60}",
        ]


def from_environ(environ: Mapping[str, str] | None = None) -> BodyLimits:
    env = Env(environ)
    return BodyLimits(
        anonymous=env.integer("PORTAL_ANONYMOUS_MAX_BODY_BYTES", 64 * KiB, minimum=1024),
        form=env.integer("PORTAL_MAX_BODY_BYTES", 2 * MiB, minimum=1024),
        upload_part=env.integer("PORTAL_RENDER_UPLOAD_PART_BYTES", 8 * MiB, minimum=64 * KiB),
        jupyter=env.integer("PORTAL_JUPYTER_MAX_BODY_BYTES", 256 * MiB, minimum=2 * MiB),
        portal_bodies_at_once=env.integer("PORTAL_PROXY_BODIES_AT_ONCE", 8, minimum=1),
        uploads_per_window=env.integer("PORTAL_RENDER_UPLOADS_PER_WINDOW", 5, minimum=1),
        upload_window_minutes=env.integer("PORTAL_RENDER_UPLOAD_WINDOW_MINUTES", 10, minimum=1),
    )
