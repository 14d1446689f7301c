"""Scene files for the tests, made here: .blend files with a real header and block chain (plain, gzip and
zstd, as Blender 3.x and 4.x write them), and zips good and bad."""

from __future__ import annotations

import gzip
import io
import stat
import struct
import warnings
import zipfile

import zstandard

# A few blocks as Blender writes them: render info, a thumbnail, the globals, a scene, the DNA; then ENDB.
BLOCKS = [
    (b"REND", b"\x01" * 72),
    (b"TEST", b"\x02" * 256),
    (b"GLOB", b"\x03" * 200),
    (b"SC\x00\x00", b"\x04" * 1500),
    (b"DNA1", b"SDNANAME" + b"\x05" * 600),
]


def blend(version: str = "304", pointer: int = 8, little: bool = True, blocks=BLOCKS) -> bytes:  # type: ignore[no-untyped-def]
    endian = "<" if little else ">"
    head = struct.Struct(endian + ("4siQii" if pointer == 8 else "4siIii"))
    out = b"BLENDER" + (b"-" if pointer == 8 else b"_") + (b"v" if little else b"V") + version.encode()
    for number, (code, data) in enumerate(blocks):
        out += head.pack(code, len(data), 0x7F0000 + number, 0, 1) + data
    return out + head.pack(b"ENDB", 0, 0, 0, 0)


def zstd_blend(version: str = "402") -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(blend(version))


def gzip_blend() -> bytes:
    return gzip.compress(blend("279"))


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 200


def zip_of(*entries: tuple[str | zipfile.ZipInfo, bytes], compress: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w", compression=compress) as archive:
        warnings.simplefilter("ignore")  # a name twice, on purpose
        for name, data in entries:
            archive.writestr(name, data)
    return buffer.getvalue()


def unix_entry(name: str, mode: int) -> zipfile.ZipInfo:
    """An entry that says it was made on Unix with this file type and mode (a link, a FIFO...)."""
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = mode << 16
    return info


def symlink_zip() -> bytes:
    return zip_of(("scene.blend", blend()), (unix_entry("textures/wood.png", stat.S_IFLNK | 0o777), b"/etc/passwd"))


def fifo_zip() -> bytes:
    return zip_of(("scene.blend", blend()), (unix_entry("pipe", stat.S_IFIFO | 0o644), b""))


def bomb_zip(unpacked: int) -> bytes:
    """A tiny archive whose one entry unpacks to ``unpacked`` bytes of zeros."""
    buffer = io.BytesIO()
    chunk = b"\x00" * (1 << 20)
    with (
        zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive,
        archive.open("scene.blend", "w") as entry,
    ):
        for _ in range(unpacked // len(chunk)):
            entry.write(chunk)
    return buffer.getvalue()


def lying_zip() -> bytes:
    """A zip whose directory says its texture is 10 bytes, while the entry unpacks to 100 kB."""
    data = bytearray(zip_of(("scene.blend", blend()), ("textures/big.raw", b"\x07" * 100_000)))
    local = data.find(b"PK\x03\x04", 10)  # the second entry's local header
    central = data.rfind(b"PK\x01\x02")  # the last entry's central directory record
    struct.pack_into("<L", data, local + 22, 10)
    struct.pack_into("<L", data, central + 24, 10)
    return bytes(data)


def many_entries_zip(count: int) -> bytes:
    entries = [("scene.blend", blend())] + [(f"cache/{number}.bin", b"") for number in range(count)]
    return zip_of(*entries, compress=zipfile.ZIP_STORED)
