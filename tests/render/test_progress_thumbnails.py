"""Thumbnails of finished frames: small JPEGs for the live preview and the gallery, made only of a PNG no
larger than the job renders, opened once without following a link; any other file gets none, and leaves
nothing behind. (tests/render/test_frames_from_the_sandbox.py shows the same while a real chunk renders.)"""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image

from sessions.render.files import open_written
from sessions.render.thumbnails import make_thumbnail, most_pixels

FRAME = most_pixels(1280, 720, 100)


def thumbnail_of(folder: Path, name: str, most: int = FRAME) -> Path | None:
    opened = open_written(folder, name)
    if opened is None:
        return None
    with opened:
        return make_thumbnail(opened, folder / "thumbs", 320, name, most)


def test_a_thumbnail_is_made_small_and_a_file_that_is_no_image_gets_none(tmp_path: Path) -> None:
    Image.new("RGBA", (1280, 720), (200, 10, 10, 255)).save(tmp_path / "frame_000007.png")
    made = thumbnail_of(tmp_path, "frame_000007.png")
    assert made is not None and made.name == "frame_000007.jpg"
    with Image.open(made) as thumbnail:
        assert thumbnail.size == (320, 180) and thumbnail.format == "JPEG"
    (tmp_path / "frame_000008.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    assert thumbnail_of(tmp_path, "frame_000008.png") is None
    assert sorted(path.name for path in (tmp_path / "thumbs").iterdir()) == ["frame_000007.jpg"]


def test_a_png_that_claims_more_pixels_than_the_job_renders_gets_no_thumbnail(tmp_path: Path) -> None:
    huge = tmp_path / "frame_000009.png"
    # A PNG header that claims 100000 x 100000 pixels: refused before anything is decoded.
    Image.new("L", (1, 1)).save(huge)
    data = bytearray(huge.read_bytes())
    data[16:24] = (100_000).to_bytes(4, "big") * 2
    huge.write_bytes(bytes(data))
    assert thumbnail_of(tmp_path, "frame_000009.png") is None
    Image.new("L", (1281, 720)).save(tmp_path / "frame_000010.png")
    assert thumbnail_of(tmp_path, "frame_000010.png", most=1280 * 720) is None, "one pixel too many"
    assert thumbnail_of(tmp_path, "frame_000010.png", most=1281 * 720) is not None


def test_a_link_a_fifo_or_a_folder_under_a_frames_name_is_not_opened(tmp_path: Path) -> None:
    outside = tmp_path / "outside.png"
    Image.new("RGB", (8, 8)).save(outside)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "frame_000001.png").symlink_to(outside)
    os.mkfifo(tmp_path / "out" / "frame_000002.png")
    (tmp_path / "out" / "frame_000003.png").mkdir()
    for name in ("frame_000001.png", "frame_000002.png", "frame_000003.png", "../outside.png", "missing.png"):
        assert open_written(tmp_path / "out", name) is None, name
    (tmp_path / "linked").symlink_to(tmp_path / "out")
    Image.new("RGB", (8, 8)).save(tmp_path / "out" / "frame_000004.png")
    assert open_written(tmp_path / "linked", "frame_000004.png") is None, "the folder is not reached through a link"
