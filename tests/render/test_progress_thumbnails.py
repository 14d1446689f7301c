"""Thumbnails of finished frames: small JPEGs for the live preview and the gallery; a frame Pillow cannot
read gets none, and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from sessions.render.thumbnails import make_thumbnail


def test_a_thumbnail_is_made_small_and_a_file_that_is_no_image_gets_none(tmp_path: Path) -> None:
    frame = tmp_path / "frame_000007.png"
    Image.new("RGBA", (1280, 720), (200, 10, 10, 255)).save(frame)
    made = make_thumbnail(frame, tmp_path / "thumbs", 320)
    assert made is not None and made.name == "frame_000007.jpg"
    with Image.open(made) as thumbnail:
        assert thumbnail.size == (320, 180) and thumbnail.format == "JPEG"
    bogus = tmp_path / "frame_000008.png"
    bogus.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    assert make_thumbnail(bogus, tmp_path / "thumbs", 320) is None
    assert sorted(path.name for path in (tmp_path / "thumbs").iterdir()) == ["frame_000007.jpg"]


def test_an_image_that_claims_more_pixels_than_any_frame_gets_no_thumbnail(tmp_path: Path) -> None:
    huge = tmp_path / "frame_000009.png"
    # A PNG header that claims 100000 x 100000 pixels: refused before anything is decoded.
    Image.new("L", (1, 1)).save(huge)
    data = bytearray(huge.read_bytes())
    data[16:24] = (100_000).to_bytes(4, "big") * 2
    huge.write_bytes(bytes(data))
    assert make_thumbnail(huge, tmp_path / "thumbs", 320) is None
    assert list((tmp_path / "thumbs").iterdir()) == []
