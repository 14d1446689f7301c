"""Thumbnails of rendered frames, for the job page's gallery and its live preview.

A frame was written by the render sandbox, which runs an untrusted scene, so it is decoded with no more
trust than the sandbox has: only as a PNG (Pillow is told so, and the file's own header must say so), and
only if it is no larger than the job renders (the probe's scene facts at the job's resolution percentage);
the caller hands over the file opened once without following a link (``files.open_written``). One that
does not pass gets no thumbnail, never an error.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from PIL import Image, UnidentifiedImageError

from sessions.render.files import make_private

log = logging.getLogger(__name__)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A stereo pair written side by side (or one above the other) is one file of twice a frame's pixels.
STEREO = 2
# What a PNG of N pixels may take on disk at most: 8 bytes a pixel (RGBA at 16 bits), each row's filter byte
# and deflate's stored blocks included, plus room for its other chunks. Past it, it is no frame of ours.
BYTES_PER_PIXEL = 9
OTHER_CHUNKS_BYTES = 1 << 20


def thumbnail_name(frame_file: str) -> str:
    """``frame_000001.png`` -> ``frame_000001.jpg``."""
    return f"{Path(frame_file).stem}.jpg"


def most_pixels(width: int, height: int, percentage: int) -> int:
    """The most pixels a frame of a scene of ``width`` x ``height`` rendered at ``percentage`` may hold: its
    size as Blender computes it (each side times the percentage, rounded down), twice over (``STEREO``)."""
    return STEREO * max(1, width * percentage // 100) * max(1, height * percentage // 100)


def png_size(head: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG's first 24 bytes (its signature and IHDR); None if they are not a PNG's."""
    if len(head) < 24 or not head.startswith(PNG_SIGNATURE) or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def refusal(frame: BinaryIO, most: int) -> str | None:
    """Why the open file is not decoded (not a PNG, more pixels or bytes than ``most`` pixels allow); None
    if it may be. Reads its header only, then returns to its start."""
    head = frame.read(24)
    frame.seek(0)
    size = png_size(head)
    if size is None:
        return "not a PNG"
    if size[0] * size[1] > most:
        return f"{size[0]} x {size[1]} pixels, more than the job renders ({most} at most)"
    if os.fstat(frame.fileno()).st_size > most * BYTES_PER_PIXEL + OTHER_CHUNKS_BYTES:
        return "larger on disk than any PNG of a frame the job renders"
    return None


def make_thumbnail(frame: BinaryIO, folder: Path, longest_side: int, of: str, most: int) -> Path | None:
    """A JPEG of the frame (a file opened by ``files.open_written``), its longest side ``longest_side``
    pixels at most, in ``folder``, named after ``of`` (the frame's file: ``frame`` may be Blender's small PNG
    of it); None if it is no PNG of at most ``most`` pixels that Pillow can read."""
    why_not = refusal(frame, most)
    if why_not is not None:
        log.warning("no thumbnail of %s: %s", of, why_not)
        return None
    make_private(folder)
    target = folder / thumbnail_name(of)
    # Pillow's own guard, behind ours: no frame the portal renders at all is larger than this.
    Image.MAX_IMAGE_PIXELS = STEREO * settings.RENDER_MAX_RESOLUTION**2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(frame, formats=["PNG"]) as image:
                image.thumbnail((longest_side, longest_side))
                image.convert("RGB").save(target, "JPEG", quality=85)
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        log.warning("no thumbnail of %s: %s", of, error)
        target.unlink(missing_ok=True)
        return None
    return target
