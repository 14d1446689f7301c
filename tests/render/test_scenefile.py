"""The scene checks on files made here: a .blend's header and block chain in its three encodings, and a
zip's directory judged before anything is extracted. Each refusal leaves nothing behind."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from sessions.render import scenefile
from sessions.render.scenefile import SceneRefused, ZipLimits
from tests.render import scenes

LIMITS = ZipLimits(max_entries=100, max_unpacked_bytes=4 << 20)
BIG = 1 << 30


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "version", "compression"),
    [
        (scenes.blend("304"), "3.4", "none"),
        (scenes.blend("293", pointer=4), "2.93", "none"),
        (scenes.blend("301", little=False), "3.1", "none"),
        (scenes.zstd_blend("402"), "4.2", "zstd"),
        (scenes.gzip_blend(), "2.79", "gzip"),
    ],
    ids=["plain", "32-bit", "big-endian", "zstd", "gzip"],
)
def test_a_blend_is_read_plain_or_compressed(tmp_path: Path, data: bytes, version: str, compression: str) -> None:
    found = scenefile.check_blend(write(tmp_path, "scene.blend", data), BIG)
    assert (found.version, found.compression, found.blocks) == (version, compression, len(scenes.BLOCKS))


def test_a_zstd_blend_written_as_many_frames_is_read_across_them(tmp_path: Path) -> None:
    whole = scenes.blend("400")
    compressor = zstandard_compressor()
    framed = b"".join(compressor.compress(whole[start : start + 500]) for start in range(0, len(whole), 500))
    assert scenefile.check_blend(write(tmp_path, "scene.blend", framed), BIG).blocks == len(scenes.BLOCKS)


def zstandard_compressor():  # type: ignore[no-untyped-def]
    import zstandard

    return zstandard.ZstdCompressor(level=1)


@pytest.mark.parametrize(
    ("data", "words", "code"),
    [
        (b"", "is empty", "empty"),
        (scenes.PNG, "is not a Blender file: it is a PNG image", "not_blend"),
        (b"\xff\xd8\xff\xe0" + b"\x00" * 100, "it is a JPEG image", "not_blend"),
        (b"hello, I am a text file", "a .blend starts with 'BLENDER'", "not_blend"),
        (scenes.blend()[:-24], "ends before Blender's end-of-file block", "truncated"),
        (scenes.blend()[:600], "ends inside block", "truncated"),
        (scenes.blend()[:9], "ends inside its header", "truncated"),
        (b"BLENDER?v304" + b"\x00" * 40, "header is damaged", "truncated"),
        (scenes.blend()[:40] + b"\xff" * 200, "does not read as a Blender block", "damaged"),
        (scenes.blend(blocks=scenes.BLOCKS[:-1]), "no structure description", "damaged"),
        (scenes.zstd_blend()[:-40], "incomplete", "truncated"),
        (scenes.gzip_blend()[:-30], "damaged or incomplete gzip-compressed file", "truncated"),
        (b"\x1f\x8b" + b"\x00" * 50, "damaged or incomplete gzip-compressed file", "truncated"),
        (
            __import__("gzip").compress(scenes.PNG),
            "gzip-compressed, but what is inside is not a Blender file",
            "not_blend",
        ),
        (b"BLENDER17-01v0500" + b"\x00" * 64, "Blender 5.0 or later", "too_new"),
    ],
    ids=[
        "empty",
        "png",
        "jpeg",
        "text",
        "no-endb",
        "cut-in-a-block",
        "cut-in-the-header",
        "bad-pointer-size",
        "garbage-block",
        "no-dna",
        "zstd-cut",
        "gzip-cut",
        "gzip-garbage",
        "gzip-png",
        "blender-5",
    ],
)
def test_what_is_not_a_whole_blend_is_refused_in_words(tmp_path: Path, data: bytes, words: str, code: str) -> None:
    with pytest.raises(SceneRefused) as refused:
        scenefile.check_blend(write(tmp_path, "scene.blend", data), BIG)
    assert refused.value.code == code
    assert words in refused.value.message


def test_a_blend_that_unpacks_past_the_limit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SceneRefused) as refused:
        scenefile.check_blend(write(tmp_path, "scene.blend", scenes.zstd_blend()), 1000)
    assert refused.value.code == "too_big"


def test_a_good_zip_is_judged_then_extracted_with_its_assets(tmp_path: Path) -> None:
    path = write(
        tmp_path, "s.zip", scenes.zip_of(("shot/main.blend", scenes.blend()), ("shot/tex/wood.png", scenes.PNG))
    )
    into = tmp_path / "scene"
    found = scenefile.extract_zip(path, into, LIMITS)
    assert found.blend_files == ("shot/main.blend",)
    assert (into / "shot/tex/wood.png").read_bytes() == scenes.PNG
    assert scenefile.check_blend(into / "shot/main.blend", BIG).version == "3.4"


def test_windows_separators_are_folders_not_names(tmp_path: Path) -> None:
    path = write(tmp_path, "s.zip", scenes.zip_of(("shot\\main.blend", scenes.blend())))
    scenefile.extract_zip(path, tmp_path / "scene", LIMITS)
    assert (tmp_path / "scene" / "shot" / "main.blend").is_file()


def test_macos_resource_forks_are_not_scenes(tmp_path: Path) -> None:
    path = write(tmp_path, "s.zip", scenes.zip_of(("a.blend", scenes.blend()), ("__MACOSX/._a.blend", b"\x00\x05")))
    assert scenefile.check_zip(path, LIMITS).blend_files == ("a.blend",)


@pytest.mark.parametrize(
    ("data", "code", "words"),
    [
        (
            scenes.zip_of(("scene.blend", scenes.blend()), ("../evil.txt", b"x")),
            "parent",
            "leaves its folder ('../evil.txt')",
        ),
        (scenes.zip_of(("a/../../evil.blend", scenes.blend())), "parent", "leaves its folder"),
        (scenes.zip_of(("..\\evil.blend", scenes.blend())), "parent", "leaves its folder"),
        (
            scenes.zip_of(("/etc/cron.d/evil", b"x"), ("scene.blend", scenes.blend())),
            "absolute",
            "an absolute path ('/etc/cron.d/evil')",
        ),
        (scenes.zip_of(("C:/evil.blend", scenes.blend())), "absolute", "an absolute path"),
        (scenes.symlink_zip(), "symlink", "a symbolic link ('textures/wood.png')"),
        (scenes.fifo_zip(), "special", "a special file ('pipe')"),
        (scenes.zip_of(("textures/wood.png", scenes.PNG), ("notes.txt", b"hi")), "no_blend", "holds no .blend file"),
        (scenes.zip_of(("a.blend", scenes.blend()), ("a.blend", scenes.blend())), "duplicate", "holds 'a.blend' twice"),
        (
            scenes.zip_of(("a.blend", scenes.blend()), ("a.blend/b.png", b"x")),
            "duplicate",
            "both as a file and as a folder",
        ),
        (scenes.bomb_zip(64 << 20), "too_big", "unpacks to more than 4 MiB"),
        (scenes.many_entries_zip(150), "too_many", "holds 151 entries; a scene may hold at most 100 files"),
        (scenes.blend(), "bad_zip", "not a zip archive"),
        (b"", "bad_zip", "not a zip archive"),
        (scenes.zip_of(("scene.blend", scenes.blend()))[:-10], "bad_zip", "not a zip archive"),
    ],
    ids=[
        "dot-dot",
        "dot-dot-inside",
        "dot-dot-backslash",
        "absolute",
        "drive-letter",
        "symlink",
        "fifo",
        "no-blend",
        "twice",
        "file-and-folder",
        "bomb",
        "many-entries",
        "a-blend-named-zip",
        "empty",
        "cut",
    ],
)
def test_an_unsafe_or_useless_zip_is_refused_before_anything_is_extracted(
    tmp_path: Path, data: bytes, code: str, words: str
) -> None:
    path = write(tmp_path, "s.zip", data)
    into = tmp_path / "scene"
    with pytest.raises(SceneRefused) as refused:
        scenefile.extract_zip(path, into, LIMITS)
    assert refused.value.code == code
    assert words in refused.value.message
    assert not into.exists()


def test_the_bomb_is_tiny_and_refused_from_its_directory_alone(tmp_path: Path) -> None:
    data = scenes.bomb_zip(64 << 20)
    assert len(data) < 200_000
    with pytest.raises(SceneRefused):
        scenefile.check_zip(write(tmp_path, "s.zip", data), LIMITS)


def test_tens_of_thousands_of_entries_are_refused_from_the_end_record(tmp_path: Path) -> None:
    path = write(tmp_path, "s.zip", scenes.many_entries_zip(30_000))
    with pytest.raises(SceneRefused) as refused:
        scenefile.check_zip(path, ZipLimits(max_entries=5000, max_unpacked_bytes=BIG))
    assert "holds 30,001 entries" in refused.value.message


def test_more_entries_than_a_plain_zip_counts_are_read_from_its_zip64_end_record(tmp_path: Path) -> None:
    path = write(tmp_path, "s.zip", scenes.many_entries_zip(70_000))
    with pytest.raises(SceneRefused) as refused:
        scenefile.check_zip(path, ZipLimits(max_entries=5000, max_unpacked_bytes=BIG))
    assert "holds 70,001 entries" in refused.value.message


def test_an_entry_that_unpacks_to_more_than_its_directory_says_stops_and_leaves_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, "s.zip", scenes.lying_zip())
    assert scenefile.check_zip(path, LIMITS).unpacked_bytes < 10_000  # the directory's word for it
    into = tmp_path / "scene"
    with pytest.raises(SceneRefused) as refused:
        scenefile.extract_zip(path, into, LIMITS)
    assert refused.value.code in ("too_big", "bad_zip")
    assert not into.exists()


def test_an_encrypted_entry_is_refused(tmp_path: Path) -> None:
    data = bytearray(scenes.zip_of(("scene.blend", scenes.blend()), compress=zipfile.ZIP_STORED))
    central = data.rfind(b"PK\x01\x02")
    data[central + 8] |= 0x1  # the 'encrypted' flag bit, as a password-protected zip sets it
    with pytest.raises(SceneRefused) as refused:
        scenefile.check_zip(write(tmp_path, "s.zip", bytes(data)), LIMITS)
    assert refused.value.code == "encrypted"
