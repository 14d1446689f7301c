"""Reading and removing what render jobs keep on disk: never following a link, never outside the render
folder, and also when a container left folders it made unreadable.

A sandboxed run writes into a host folder, so anything in a job's folder may be a link to elsewhere, and
may be swapped for one while the run goes on: a file it wrote is opened once, without following a link,
and what is checked and read is that one open file; links are removed as links, and a job folder reached
through a link is left alone and reported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)


def make_private(folder: Path) -> None:
    """Make a folder, and those above it that are missing, each for the portal's user alone (0700): nobody
    else on the host lists or reads a person's jobs (the render sandbox reaches its folders through its
    mounts, whatever the folders above them allow)."""
    missing: list[Path] = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made by another upload meanwhile
            path.mkdir(mode=0o700)


def open_written(folder: Path, name: str) -> BinaryIO | None:
    """A file a sandbox wrote, opened for reading once: ``name`` a plain name inside ``folder``, the folder and
    then the file opened without following a link (a FIFO without waiting for a writer), and only a regular
    file kept. None for anything else: a link, a folder, a FIFO, a name with a slash, nothing there.
    Whatever is swapped in at that name afterwards, the caller reads the file that was checked."""
    if not name or "/" in name or name in (".", ".."):
        return None
    try:
        directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except OSError:  # ELOOP for a link
        return None
    finally:
        os.close(directory)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        return None
    return os.fdopen(descriptor, "rb")


def _made_removable(folder: Path) -> None:
    """Folders a container set to mode 000 become their owner's again, so they can be emptied. os.walk
    never follows links; each child is opened up before the walk descends into it."""
    os.chmod(folder, 0o700)
    for current, folders, _ in os.walk(folder):
        for name in folders:
            child = os.path.join(current, name)
            if not os.path.islink(child):
                with contextlib.suppress(OSError):
                    os.chmod(child, 0o700)


def remove_entry(path: Path) -> None:
    """Remove a file, a link (never what it points to) or a folder with all it holds."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    _made_removable(path)
    # The fd-based rmtree (Linux) never follows a link, even one swapped in while it runs.
    assert shutil.rmtree.avoids_symlink_attacks
    shutil.rmtree(path)


def inside(root: Path, folder: Path) -> bool:
    """Whether ``folder`` lies in ``root`` with no link on the way from it (the folder itself included)."""
    try:
        relative = folder.relative_to(root)
    except ValueError:
        return False
    step = root
    for part in relative.parts:
        step = step / part
        if part in ("", ".", "..") or step.is_symlink():
            return False
    return folder.resolve().is_relative_to(root.resolve())


def remove_job_folder(root: Path, folder: Path) -> bool:
    """Remove a job's folder (and its owner's, once empty); True once it is gone. One reached through a link,
    or outside ``root``, is left alone and logged."""
    if not inside(root, folder):
        log.error("not removing %s: it is not a folder inside %s", folder, root)
        return False
    try:
        if os.path.lexists(folder):
            remove_entry(folder)
    except OSError as error:
        log.error("could not remove %s: %s", folder, error)
        return False
    with contextlib.suppress(OSError):  # another job of its owner's lives there
        folder.parent.rmdir()
    return not os.path.lexists(folder)


def prune(folder: Path, keep: set[Path]) -> None:
    """Remove everything in ``folder`` but the files named in ``keep``."""
    with contextlib.suppress(FileNotFoundError):
        for entry in list(folder.iterdir()):
            if entry not in keep:
                with contextlib.suppress(OSError):
                    remove_entry(entry)
