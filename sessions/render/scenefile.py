"""What an uploaded scene file is, read without Blender: a .blend's header and block chain, a zip's entries.

Everything here treats the file as hostile and reads it as a stream: a .blend (plain, or compressed
with gzip or zstd as Blender writes it) must be a complete chain of blocks ending in ``ENDB``; a zip
is judged from its directory before one byte is extracted, then extracted with each entry's size held
to what the directory said. A refusal is a SceneRefused whose message is for the file's owner.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import stat
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import zstandard

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BLEND_MAGIC = b"BLENDER"
_READ = 1024 * 1024
# What people upload by mistake, to say what the file is instead.
_LOOKALIKES = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"II*\x00": "a TIFF image",
    b"MM\x00*": "a TIFF image",
    b"\x76\x2f\x31\x01": "an OpenEXR image",
    b"%PDF": "a PDF document",
    b"PK\x03\x04": "a zip archive (upload it with a .zip name)",
    b"RIFF": "a RIFF file (WebP image, WAV or AVI)",
}


class SceneRefused(Exception):
    """The upload is not a scene the portal will take; ``message`` says why to its owner."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True)
class BlendFile:
    """What the header says: who wrote the file and how."""

    version: str  # "3.4", "4.2"
    pointer_size: int
    little_endian: bool
    compression: str  # "none", "gzip" or "zstd"
    blocks: int


# A .blend ----------------------------------------------------------------------------------------


Progress = Callable[[int], object]  # told how many bytes of the file have been read so far


def check_blend(path: Path, max_unpacked_bytes: int, name: str = "", progress: Progress | None = None) -> BlendFile:
    """The file at ``path`` as a .blend, or SceneRefused: not a Blender file, empty, truncated, damaged,
    or (decompressed) larger than ``max_unpacked_bytes``. Reads (and decompresses) all of it: not for a request."""
    label = f"'{name}'" if name else "The file"
    with path.open("rb") as raw, _opened(raw, label) as compression:
        watched: BinaryIO = _Watched(raw, progress) if progress else raw  # type: ignore[assignment]  # reads alike
        try:
            with _decompressed(watched, compression) as stream:
                plain_size = path.stat().st_size if compression == "none" else None
                return _read_blend(stream, compression, max_unpacked_bytes, label, plain_size)
        except (EOFError, gzip.BadGzipFile, zlib.error, zstandard.ZstdError) as error:
            raise SceneRefused(
                f"{label} is a damaged or incomplete {compression}-compressed file ({error}).", "truncated"
            ) from None


def check_blend_header(path: Path, name: str = "") -> None:
    """A first look that reads only the start of the file (decompressing its first bytes): SceneRefused if it is
    empty or not a Blender file Blender 4.x can read. Quick enough for a request; check_blend reads the rest."""
    label = f"'{name}'" if name else "The file"
    with path.open("rb") as raw, _opened(raw, label) as compression:
        try:
            with _decompressed(raw, compression) as stream:
                _read_header(stream, compression, label)
        except (EOFError, gzip.BadGzipFile, zlib.error, zstandard.ZstdError) as error:
            raise SceneRefused(
                f"{label} is a damaged or incomplete {compression}-compressed file ({error}).", "truncated"
            ) from None


@contextmanager
def _opened(raw: BinaryIO, label: str) -> Iterator[str]:
    """How the file is compressed, read from its first bytes (the file left at its start); SceneRefused if empty."""
    magic = raw.read(len(BLEND_MAGIC))
    raw.seek(0)
    if not magic:
        raise SceneRefused(f"{label} is empty.", "empty")
    yield "gzip" if magic.startswith(GZIP_MAGIC) else "zstd" if magic.startswith(ZSTD_MAGIC) else "none"


class _Watched:
    """A file that says how far it has been read, every 4 MiB or so."""

    def __init__(self, raw: BinaryIO, progress: Progress) -> None:
        self.raw, self.progress, self._told = raw, progress, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        where = self.raw.tell()
        if where - self._told >= 4 * _READ or not data:
            self._told = where
            self.progress(where)
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self.raw, name)


@contextmanager
def _decompressed(raw: BinaryIO, compression: str) -> Iterator[BinaryIO]:
    if compression == "gzip":
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            yield unzipped  # type: ignore[misc]
    elif compression == "zstd":
        # Blender writes many zstd frames (so it can seek); read across them all.
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as unpacked:
            yield unpacked
    else:
        yield raw


def _read_blend(stream: BinaryIO, compression: str, limit: int, label: str, plain_size: int | None) -> BlendFile:
    header, pointer, endian = _read_header(stream, compression, label)
    head = struct.Struct(endian + ("4siIii" if pointer == 4 else "4siQii"))
    blocks = _walk_blocks(stream, head, limit, label, plain_size)
    if compression != "none":
        stream.read(_READ)  # to the compressed stream's end: a cut or corrupt one raises here
    version = header[9:12].decode()
    return BlendFile(f"{int(version[0])}.{int(version[1:])}", pointer, endian == "<", compression, blocks)


def _read_header(stream: BinaryIO, compression: str, label: str) -> tuple[bytes, int, str]:
    """The file's 12-byte header, its pointer size and byte order; SceneRefused if it is no Blender file."""
    header = _read_exactly(stream, 12)
    if len(header) < 12 and BLEND_MAGIC.startswith(header[: len(BLEND_MAGIC)]):
        raise SceneRefused(f"{label} is incomplete: it ends inside its header.", "truncated")
    if not header.startswith(BLEND_MAGIC):
        raise SceneRefused(_not_blender(header, compression, label), "not_blend")
    if header[7:8].isdigit():
        raise SceneRefused(
            f"{label} was saved by Blender 5.0 or later, whose file format this portal's renderer cannot read; "
            "save it from Blender 4.x (or older) and upload it again.",
            "too_new",
        )
    pointer = {b"_": 4, b"-": 8}.get(header[7:8])
    endian = {b"v": "<", b"V": ">"}.get(header[8:9])
    if pointer is None or endian is None or not header[9:12].isdigit():
        raise SceneRefused(f"{label} starts like a Blender file but its header is damaged.", "truncated")
    return header, pointer, endian


def _not_blender(header: bytes, compression: str, label: str) -> str:
    if compression != "none":
        return f"{label} is {compression}-compressed, but what is inside is not a Blender file."
    for magic, what in _LOOKALIKES.items():
        if header.startswith(magic):
            return f"{label} is not a Blender file: it is {what}."
    return f"{label} is not a Blender file (a .blend starts with 'BLENDER')."


def _walk_blocks(stream: BinaryIO, head: struct.Struct, limit: int, label: str, plain_size: int | None) -> int:
    """Follow the chain of blocks to ``ENDB``; a file that stops before it was cut short."""
    total, blocks, seen_dna = 12, 0, False
    while True:
        raw = _read_exactly(stream, head.size)
        if len(raw) < head.size:
            raise SceneRefused(f"{label} is incomplete: it ends before Blender's end-of-file block.", "truncated")
        code, length = head.unpack(raw)[:2]
        if not _BLOCK_CODE.fullmatch(code) or length < 0:
            raise SceneRefused(f"{label} is damaged: block {blocks + 1} does not read as a Blender block.", "damaged")
        if code == b"ENDB":
            break
        total += head.size + length
        if total > limit:
            raise SceneRefused(
                f"{label} unpacks to more than {size_words(limit)}, the most a scene may hold.", "too_big"
            )
        if _skip(stream, length, plain_size) < length:
            raise SceneRefused(f"{label} is incomplete: it ends inside block {blocks + 1}.", "truncated")
        blocks += 1
        seen_dna = seen_dna or code == b"DNA1"
    if not seen_dna:
        raise SceneRefused(f"{label} is damaged: it has no structure description (DNA1 block).", "damaged")
    return blocks


# Block codes are four characters: upper-case letters and digits, two-letter ID codes padded with NULs.
_BLOCK_CODE = re.compile(rb"[A-Z0-9]{2}(?:[A-Z0-9]{2}|[A-Z0-9]\x00|\x00\x00)")


def _read_exactly(stream: BinaryIO, count: int) -> bytes:
    data = b""
    while len(data) < count:
        more = stream.read(count - len(data))
        if not more:
            break
        data += more
    return data


def _skip(stream: BinaryIO, count: int, plain_size: int | None) -> int:
    """Read past ``count`` bytes (a plain file of ``plain_size`` bytes seeks); returns how many there were."""
    if plain_size is not None:
        here = stream.tell()
        stream.seek(min(here + count, plain_size))
        return stream.tell() - here
    skipped = 0
    while skipped < count:
        chunk = stream.read(min(_READ, count - skipped))
        if not chunk:
            break
        skipped += len(chunk)
    return skipped


# A zip -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZipLimits:
    max_entries: int
    max_unpacked_bytes: int
    max_ratio: int = 100  # what an entry over RATIO_FROM, or the whole zip, may unpack to, in times its packed size


RATIO_FROM = 1024 * 1024  # smaller entries may compress as well as they like: they unpack to little


@dataclass(frozen=True)
class ZipScene:
    """A zip that may be extracted: its .blend files (paths inside it) and how much it unpacks to."""

    blend_files: tuple[str, ...]
    entries: int
    unpacked_bytes: int


_SUPPORTED = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
_UNIX = 3  # ZipInfo.create_system of archives made on Unix: only they carry file types
_EOCD = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")


def check_zip(path: Path, limits: ZipLimits) -> ZipScene:
    """Judge a zip from its directory alone, before anything is extracted; SceneRefused if any entry is
    unsafe (absolute, '..', a link or device), the archive is too large unpacked, holds too many entries,
    or holds no .blend."""
    entries, directory_bytes = _declared_entries(path)
    # The directory is read into memory to be judged: refuse an oversized one before reading it.
    if entries > limits.max_entries or directory_bytes > limits.max_entries * 1024 + _READ:
        raise SceneRefused(
            f"The zip holds {entries:,} entries; a scene may hold at most {limits.max_entries:,} files.", "too_many"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError, EOFError) as error:
        raise SceneRefused(f"The zip cannot be read ({error}).", "bad_zip") from None
    if len(members) > limits.max_entries:
        raise SceneRefused(
            f"The zip holds {len(members):,} entries; a scene may hold at most {limits.max_entries:,} files.",
            "too_many",
        )
    return _judge(members, limits)


def _judge(members: list[zipfile.ZipInfo], limits: ZipLimits) -> ZipScene:
    unpacked, files, folders = 0, set(), set()
    blends: list[str] = []
    for member in members:
        name = entry_path(member)
        _check_entry(member, name)
        if member.is_dir():
            folders.add(name)
            continue
        if name in files:
            raise SceneRefused(f"The zip holds '{name}' twice.", "duplicate")
        files.add(name)
        folders.update(str(parent) for parent in PurePosixPath(name).parents if str(parent) != ".")
        unpacked += member.file_size
        if unpacked > limits.max_unpacked_bytes:
            raise SceneRefused(
                f"The zip unpacks to more than {size_words(limits.max_unpacked_bytes)}, the most a scene may hold.",
                "too_big",
            )
        if _is_blend(name):
            blends.append(name)
    _check_ratio(members, limits.max_ratio)
    clash = files & folders
    if clash:
        raise SceneRefused(f"The zip holds '{min(clash)}' both as a file and as a folder.", "duplicate")
    if not blends:
        raise SceneRefused("The zip holds no .blend file: put the scene's .blend in it with its assets.", "no_blend")
    return ZipScene(tuple(sorted(blends)), len(members), unpacked)


def _check_ratio(members: list[zipfile.ZipInfo], most: int) -> None:
    """Refuse a zip that unpacks to many times its packed size (a zip of zeros is about 1,000:1), from what its
    directory declares: each entry over RATIO_FROM, and all of them together. Extraction then holds each entry
    to its declared size, so a directory that lies is caught there."""
    files = [member for member in members if not member.is_dir()]
    for member in files:
        _held_to_ratio(f"'{entry_path(member)[:200]}' in the zip", member.file_size, member.compress_size, most)
    unpacked, packed = sum(m.file_size for m in files), sum(m.compress_size for m in files)
    _held_to_ratio("The zip", unpacked, packed, most)


def _held_to_ratio(what: str, unpacked: int, packed: int, most: int) -> None:
    if unpacked <= RATIO_FROM or unpacked <= most * max(1, packed):
        return
    raise SceneRefused(
        f"{what} unpacks to {unpacked / max(1, packed):,.0f} times its packed size ({size_words(unpacked)} from "
        f"{size_words(packed)}); a scene's zip may unpack to at most {most} times. Files that compress that well "
        "are mostly empty: leave them out, or zip them without compression.",
        "ratio",
    )


def entry_path(member: zipfile.ZipInfo) -> str:
    """The entry's path as it will be extracted: '/' separators (some Windows tools write '\\')."""
    return member.filename.replace("\\", "/").rstrip("/")


def _check_entry(member: zipfile.ZipInfo, name: str) -> None:
    shown = name[:200]
    if not name or any(ord(character) < 32 for character in name):
        raise SceneRefused(f"The zip holds an entry with an empty or unprintable name ('{shown}').", "bad_name")
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        raise SceneRefused(f"The zip holds an absolute path ('{shown}'); paths must be relative.", "absolute")
    if ".." in name.split("/"):
        raise SceneRefused(f"The zip holds a path that leaves its folder ('{shown}').", "parent")
    kind = stat.S_IFMT(member.external_attr >> 16) if member.create_system == _UNIX else 0
    if kind == stat.S_IFLNK:
        raise SceneRefused(f"The zip holds a symbolic link ('{shown}'); include the file itself.", "symlink")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise SceneRefused(f"The zip holds a special file ('{shown}'); only files and folders may be in it.", "special")
    if member.flag_bits & 0x1:
        raise SceneRefused(f"The zip is password-protected ('{shown}'); upload it without a password.", "encrypted")
    if member.compress_type not in _SUPPORTED:
        raise SceneRefused(f"'{shown}' is compressed with a method zip tools rarely use; zip it again.", "method")


def _is_blend(name: str) -> bool:
    path = PurePosixPath(name)
    # macOS puts resource forks beside each file: '__MACOSX/._scene.blend' is not a scene.
    return path.suffix.lower() == ".blend" and not path.name.startswith("._") and "__MACOSX" not in path.parts


def _declared_entries(path: Path) -> tuple[int, int]:
    """How many entries the zip's end record declares, and the size of its directory, read from the end
    of the file (as zip readers find it) without reading the directory itself."""
    size = path.stat().st_size
    with path.open("rb") as raw:
        tail_start = max(0, size - (_EOCD.size + 65535))
        raw.seek(tail_start)
        tail = raw.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < _EOCD.size:
            raise SceneRefused("The file is not a zip archive, or it is incomplete.", "bad_zip")
        fields = _EOCD.unpack(tail[at : at + _EOCD.size])
        entries, directory_bytes = fields[4], fields[5]
        if entries == 0xFFFF or directory_bytes == 0xFFFFFFFF:
            return _zip64_entries(raw, tail_start + at)
        return entries, directory_bytes


def _zip64_entries(raw: BinaryIO, end_record_at: int) -> tuple[int, int]:
    if end_record_at < _ZIP64_LOCATOR.size:
        raise SceneRefused("The zip archive's directory is damaged.", "bad_zip")
    raw.seek(end_record_at - _ZIP64_LOCATOR.size)
    signature, _disk, record_at, _disks = _ZIP64_LOCATOR.unpack(raw.read(_ZIP64_LOCATOR.size))
    if signature != b"PK\x06\x07":
        raise SceneRefused("The zip archive's directory is damaged.", "bad_zip")
    raw.seek(record_at)
    record = raw.read(_ZIP64_EOCD.size)
    if len(record) < _ZIP64_EOCD.size or not record.startswith(b"PK\x06\x06"):
        raise SceneRefused("The zip archive's directory is damaged.", "bad_zip")
    fields = _ZIP64_EOCD.unpack(record)
    return fields[7], fields[8]


def extract_zip(path: Path, into: Path, limits: ZipLimits, progress: Progress | None = None) -> ZipScene:
    """Check the zip, then extract it below ``into`` (which must not exist yet). Each entry is written
    through a new file that never follows a link, held to the size the directory declared; on any
    refusal or error ``into`` is removed again. ``progress`` hears the bytes written so far after each entry and
    every few MiB. Reads and writes all of it: not for a request."""
    scene = check_zip(path, limits)
    into.mkdir(mode=0o750)
    told = progress or (lambda _written: None)
    try:
        with zipfile.ZipFile(path) as archive:
            written = 0
            for member in archive.infolist():
                written += _extract(archive, member, into, limits.max_unpacked_bytes - written, written, told)
                told(written)
    except SceneRefused:
        shutil.rmtree(into, ignore_errors=True)
        raise
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError) as error:
        shutil.rmtree(into, ignore_errors=True)
        raise SceneRefused(f"The zip could not be extracted ({error}).", "bad_zip") from None
    return scene


def _extract(
    archive: zipfile.ZipFile, member: zipfile.ZipInfo, into: Path, room: int, before: int, told: Progress
) -> int:
    target = into.joinpath(*PurePosixPath(entry_path(member)).parts)
    if not target.resolve().is_relative_to(into.resolve()):
        raise SceneRefused(f"The zip holds a path that leaves its folder ('{member.filename[:200]}').", "parent")
    if member.is_dir():
        target.mkdir(mode=0o750, parents=True, exist_ok=True)
        return 0
    target.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    written = 0
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    with os.fdopen(descriptor, "wb") as out, archive.open(member) as source:
        while chunk := source.read(_READ):
            written += len(chunk)
            if written > member.file_size or written > room:
                raise SceneRefused(f"'{member.filename[:200]}' unpacks to more than the zip declared.", "too_big")
            out.write(chunk)
            if written % (8 * _READ) < len(chunk):
                told(before + written)
    return written


def size_words(count: int) -> str:
    """A byte count as people read it: 2 GiB, 256 KiB, 10 bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} bytes"
