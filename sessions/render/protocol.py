"""The render file store's words, without Django: what the portal (``sessions.render.internal``), a GPU host's
worker (``sessions.render.portalstore``) and a Kubernetes render Job's own containers
(``sessions.render.podfiles``) all read the same way. ``sessions.render.portalstore`` says the protocol."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

PREFIX = "internal/render/jobs"  # below the portal's address (PORTAL_FILE_STORE_URL)
BLOCK = 1 << 20
# What a worker may give back, in the job's folder: a run's frame, or a thumbnail. One plain name each.
NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}"
OUTPUT_PATH = re.compile(rf"(frames/{NAME}|thumbnails)/{NAME}")
PLAIN_NAME = re.compile(NAME)


def scene_relative(path: str) -> PurePosixPath:
    """A path the portal named in a scene's list, as a path below the scene's folder; ValueError for one that
    is absolute, climbs out or is empty."""
    relative = PurePosixPath(path)
    if not path or relative.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"the portal named a scene file {path[:200]!r}, which is no path inside a scene")
    return relative


def checksum_line(relative: str, size: int, content_sha256: str) -> bytes:
    """One file's share of a scene's checksum (``sessions.render.filestore.scene_checksum``): the scene's is the
    sha256 of these lines, its files in order."""
    return f"{relative}\0{size}\0{content_sha256}\n".encode()
