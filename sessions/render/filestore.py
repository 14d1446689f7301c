"""The seam between a render job's files and the workers that render them (issue 31, item 4).

A render worker never reads the portal's render folder on its own: it is given the job's scene by the store
(``fetch_scene``), checked against the checksum unpacking recorded (``record_scene``), and gives each frame
back to the store (``put_frame``), which records the frame's checksum. Today the store is the local disk: the
portal's render folder, on the machine every worker runs on, so fetching is checking the files where they lie
and a frame stays in the run's own folder where the sandbox wrote it. A store on another machine (the next
issue's hosts) fetches the scene into the worker's scratch and carries each frame back, through the same three
calls and the same checks.

The scene's checksum covers every file of the unpacked scene: its path, size and contents, in path order. A
worker that finds anything else (a file changed, added or gone, a link where unpacking makes none) renders
nothing: the job fails and says why. The check reads the whole scene once per process and job; later
fetches compare each file's size, change time and inode with what that read saw, and read it again only if
one of them moved.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sessions.render.models import RenderJob
from sessions.runtime.render import Scene

BLOCK = 1 << 20
FRAMES = "frames"  # the folder of a job's runs' output, in its own folder
Signature = tuple[tuple[str, int, int, int], ...]  # (path, size, ctime_ns, inode) of every file, in order


class SceneChanged(ValueError):
    """The scene a worker was given is not the one unpacking checked; the message says what differs."""


@dataclass(frozen=True)
class StoredFrame:
    path: str  # relative to the job's folder
    sha256: str


def _files(folder: Path) -> list[tuple[str, os.stat_result]]:
    """Every file below ``folder`` with its status, in path order, never following a link; SceneChanged for a
    link or anything but a folder or a regular file (unpacking makes neither)."""
    found: list[tuple[str, os.stat_result]] = []
    for current, folders, names in os.walk(folder, followlinks=False):
        folders.sort()
        for name in [*folders, *names]:
            path = os.path.join(current, name)
            status = os.lstat(path)
            relative = os.path.relpath(path, folder)
            if stat.S_ISLNK(status.st_mode) or not (stat.S_ISREG(status.st_mode) or stat.S_ISDIR(status.st_mode)):
                raise SceneChanged(f"the scene holds {relative}, which is not a plain file or folder")
            if stat.S_ISREG(status.st_mode):
                found.append((relative, status))
    return sorted(found)


def _signature(found: list[tuple[str, os.stat_result]]) -> Signature:
    return tuple((relative, status.st_size, status.st_ctime_ns, status.st_ino) for relative, status in found)


def scene_checksum(folder: Path, told: Callable[[int], None] | None = None) -> tuple[str, Signature]:
    """The checksum of the scene's files (paths, sizes, contents), and the files' signature as read; ``told``
    hears the bytes read so far. FileNotFoundError when there is no scene folder."""
    if not folder.is_dir():
        raise FileNotFoundError(f"no scene folder at {folder}")
    found = _files(folder)
    total, done = hashlib.sha256(), 0
    for relative, status in found:
        content = hashlib.sha256()
        descriptor = os.open(folder / relative, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as opened:
            while block := opened.read(BLOCK):
                content.update(block)
                done += len(block)
                if told is not None:
                    told(done)
        total.update(f"{relative}\0{status.st_size}\0{content.hexdigest()}\n".encode())
    return total.hexdigest(), _signature(found)


class LocalStore:
    """The portal's render folder on this machine, which every render worker reads."""

    name = "local"

    def __init__(self) -> None:
        self._checked: dict[tuple[int, str], Signature] = {}  # (job, checksum) -> the files as last read whole
        self._lock = threading.Lock()

    def record_scene(self, job: RenderJob, told: Callable[[int], None] | None = None) -> str:
        """The checksum of the job's scene as unpacking left it, for the job's row."""
        checksum, signature = scene_checksum(job.scene_path(), told)
        with self._lock:
            self._checked[(job.pk, checksum)] = signature
        return checksum

    def fetch_scene(self, job: RenderJob) -> Scene:
        """The job's scene for a worker to render, checked against the recorded checksum; SceneChanged if it
        differs (or none was recorded), FileNotFoundError if it is gone."""
        folder = job.scene_path()
        scene = Scene(folder, job.main_file, shown_as=job.scene_name)  # FileNotFoundError without its .blend
        if not job.scene_sha256:
            raise SceneChanged("its scene was never checked (no checksum was recorded when it was unpacked)")
        key = (job.pk, job.scene_sha256)
        with self._lock:
            seen = self._checked.get(key)
        if seen is None or _signature(_files(folder)) != seen:
            checksum, signature = scene_checksum(folder)
            if checksum != job.scene_sha256:
                raise SceneChanged(
                    "its scene's files changed after they were checked when it was unpacked "
                    f"(sha256 {checksum[:12]}…, recorded {job.scene_sha256[:12]}…); nothing was rendered"
                )
            with self._lock:
                self._checked[key] = signature
        return scene

    def output_for(self, job: RenderJob, run: str) -> Path:
        """The folder one run writes its frames into (mounted at /out): the worker's scratch, which for the
        local store lies in the job's own folder."""
        return job.folder_path() / FRAMES / run

    def put_frame(self, job: RenderJob, folder: Path, name: str, opened: BinaryIO) -> StoredFrame:
        """A frame the sandbox wrote as ``folder/name`` (``opened``: that file, opened once without following a
        link) given back to the store, with its checksum as read from the open file. Locally it stays where
        it was written."""
        opened.seek(0)
        content = hashlib.sha256()
        while block := opened.read(BLOCK):
            content.update(block)
        opened.seek(0)
        return StoredFrame((folder / name).relative_to(job.folder_path()).as_posix(), content.hexdigest())


_store = LocalStore()


def store() -> LocalStore:
    """The file store render workers use (the local disk: every worker runs on the portal's machine)."""
    return _store
