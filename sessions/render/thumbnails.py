"""Thumbnails of rendered frames, for the job page's gallery and its live preview.

A frame was written by Blender from an untrusted scene, so it is read with Pillow's guard against images
far larger than any frame a job may render; one that cannot be read gets no thumbnail, never an error.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

log = logging.getLogger(__name__)
# A frame is at most 65536 x 65536 (what the scene facts admit); this is far above any sane render and
# still stops a file that claims more before it is decoded.
MOST_PIXELS = 65_536 * 65_536


def thumbnail_name(frame_file: str) -> str:
    """``frame_000001.png`` -> ``frame_000001.jpg``."""
    return f"{Path(frame_file).stem}.jpg"


def make_thumbnail(frame: Path, folder: Path, longest_side: int, of: str = "") -> Path | None:
    """A JPEG of the frame, its longest side ``longest_side`` pixels at most, in ``folder``, named after
    ``of`` (the frame's file, where ``frame`` is Blender's PNG of it); None if the file is no image Pillow can
    read (OpenEXR among them: Pillow has no reader for it, so Blender writes such a frame's PNG too)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / thumbnail_name(of or frame.name)
    Image.MAX_IMAGE_PIXELS = MOST_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(frame) as image:
                image.thumbnail((longest_side, longest_side))
                image.convert("RGB").save(target, "JPEG", quality=85)
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        log.warning("no thumbnail of %s: %s", frame, error)
        target.unlink(missing_ok=True)
        return None
    return target
