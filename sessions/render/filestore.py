"""The seam between a render job's files and the workers that render them (issue 31, item 4).

A render worker never reads the portal's render folder on its own: it is given the job's scene by the store
(``fetch_scene``), checked against the checksum unpacking recorded (``record_scene``), and gives each frame
back to the store (``put_frame``), which records the frame's checksum. Today the store is the local disk: the
portal's render folder, on the machine every worker runs on, so fetching is checking the files where they lie
and a frame stays in the run's own folder where the sandbox wrote it. A store on another machine (the next
issue's hosts) fetches the scene into the worker's scratch and carries each frame back, through the same three
calls and the same checks: ``PortalStore`` (``sessions.render.portalstore``), chosen by PORTAL_RENDER_FILE_STORE,
for a GPU host's render worker that does not share the portal's disk.

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

from sessions.render import storage
from sessions.render.models import RenderJob
from sessions.render.protocol import BLOCK, checksum_line
from sessions.runtime.render import Scene

FRAMES = "frames"  # the folder of a job's runs' output, in its own folder
THUMBNAILS = "thumbnails"  # the frames' small pictures, in the job's folder
ESTIMATE_FILE = "estimate.json"  # the probe's findings, in the job's folder (``sessions.render.services``)
Signature = tuple[tuple[str, int, int, int], ...]  # (path, size, ctime_ns, inode) of every file, in order


class SceneChanged(ValueError):
    """The scene a worker was given is not the one unpacking checked; the message says what differs."""


class StoreUnreachable(OSError):
    """The store did not answer, or refused a call; the message says which and why. The run is tried again."""


@dataclass(frozen=True)
class StoredFrame:
    path: str  # relative to the job's folder
    sha256: str


def plain_files(folder: Path) -> list[tuple[str, os.stat_result]]:
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
    found = plain_files(folder)
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
        total.update(checksum_line(relative, status.st_size, content.hexdigest()))
    return total.hexdigest(), _signature(found)


LOCAL, PORTAL = "local", "portal"  # PORTAL_RENDER_FILE_STORE's words


class LocalStore:
    """The portal's render folder on this machine, which every render worker reads."""

    name = LOCAL

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
        return self.checked_scene(job, job.scene_path())

    def checked_scene(self, job: RenderJob, folder: Path) -> Scene:
        """The scene in ``folder``, checked against the job's recorded checksum (read whole once per process and
        job, then again only when a file's size, change time or inode moved)."""
        scene = Scene(folder, job.main_file, shown_as=job.scene_name)  # FileNotFoundError without its .blend
        if not job.scene_sha256:
            raise SceneChanged("its scene was never checked (no checksum was recorded when it was unpacked)")
        key = (job.pk, job.scene_sha256)
        with self._lock:
            seen = self._checked.get(key)
        if seen is None or _signature(plain_files(folder)) != seen:
            checksum, signature = scene_checksum(folder)
            if checksum != job.scene_sha256:
                raise SceneChanged(
                    "its scene's files changed after they were checked when it was unpacked "
                    f"(sha256 {checksum[:12]}…, recorded {job.scene_sha256[:12]}…); nothing was rendered"
                )
            with self._lock:
                self._checked[key] = signature
        return scene

    def scratch(self, job: RenderJob) -> Path:
        """The worker's own folder for the job, where its runs write: for the local store, the job's folder."""
        return job.folder_path()

    def output_for(self, job: RenderJob, run: str) -> Path:
        """The folder one run writes its frames into (mounted at /out), in the worker's scratch."""
        return self.scratch(job) / FRAMES / run

    def thumbnails_for(self, job: RenderJob) -> Path:
        """Where the worker makes the frames' thumbnails (``put_thumbnail`` gives each back)."""
        return self.scratch(job) / THUMBNAILS

    def put_frame(self, job: RenderJob, folder: Path, name: str, opened: BinaryIO) -> StoredFrame:
        """A frame the sandbox wrote as ``folder/name`` (``opened``: that file, opened once without following a
        link) given back to the store, with its checksum as read from the open file. Locally it stays where
        it was written."""
        relative = (folder / name).relative_to(self.scratch(job)).as_posix()
        return StoredFrame(relative, self.keep(job, relative, opened, file_checksum(opened)))

    def put_thumbnail(self, job: RenderJob, made: Path) -> str:
        """A thumbnail the worker made in ``thumbnails_for(job)`` given back: its path in the job's folder."""
        relative = made.relative_to(self.scratch(job)).as_posix()
        with made.open("rb") as opened:
            self.keep(job, relative, opened, file_checksum(opened))
        return relative

    def keep(self, job: RenderJob, relative: str, opened: BinaryIO, sha256: str) -> str:
        """The store keeps the file at ``relative`` in the job's folder; locally it is there already."""
        return sha256

    def run_ended(self, job: RenderJob, output: Path) -> None:
        """A run ended and its frames were given back: locally they stay in its folder."""

    def measure(self, job: RenderJob) -> None:
        """The job's share of its owner's quota measured again where its files lie."""
        storage.measure_job(job)


def file_checksum(opened: BinaryIO) -> str:
    """The sha256 of an open file's contents, read from its start; it is left at its start again."""
    opened.seek(0)
    content = hashlib.sha256()
    while block := opened.read(BLOCK):
        content.update(block)
    opened.seek(0)
    return content.hexdigest()
