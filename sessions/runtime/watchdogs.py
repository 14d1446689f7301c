"""What stops a sandboxed run: its wall-time timer, and a watchdog on its output folder.

The output folder is a host folder the container writes (bind-mounted at /out), so what a run writes there
must be bounded, or a hostile scene fills the host's disk: a thread counts the folder a few times a second
and kills the container once it holds more than the run's limit.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sessions.runtime.sandbox import Sandbox

OUTPUT_CHECK_S = 0.2  # how often the output watchdog counts the folder
ENTRY_BYTES = 4096  # what one file or folder costs the disk at least (its inode, its first block)


def size_words(count: int) -> str:
    """A byte count as people read it: 2 GiB, 256 KiB, 10 bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} bytes"


class _Unreadable(Exception):
    """A folder in the output could not be read even after making it readable again."""


def _scan(folder: str) -> list[os.DirEntry[str]]:
    """A folder's entries; one the container made unreadable (mode 000) is made readable for its owner first
    (the container runs as the portal's user, or the portal is root)."""
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except FileNotFoundError:
        return []  # removed by the container meanwhile
    except PermissionError:
        try:
            os.chmod(folder, 0o700)
            with os.scandir(folder) as entries:
                return list(entries)
        except OSError as error:
            raise _Unreadable(folder) from error


def folder_bytes(folder: Path, stop_above: int | None = None) -> int:
    """What a folder holds on disk, counted without following links: each entry at least ENTRY_BYTES (many
    empty files fill a disk too), a sparse file at its full length. Stops counting once past
    ``stop_above``; a folder that cannot be read counts as past it (never as empty)."""
    total, pending = 0, [str(folder)]
    while pending:
        try:
            entries = _scan(pending.pop())
        except _Unreadable:
            return max(total, (stop_above or 0) + 1)
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            total += max(ENTRY_BYTES, info.st_size, info.st_blocks * 512)
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
        if stop_above is not None and total > stop_above:
            return total
    return total


class Watchdogs:
    """What kills a sandboxed run: its wall-time timer, and (with an output folder and a limit) a thread that
    counts the folder a few times a second. Each notes why it killed."""

    def __init__(self, runtime: Sandbox, container_id: str, output: Path | None, limit: int | None) -> None:
        self.runtime, self.container_id, self.output, self.limit = runtime, container_id, output, limit
        self.timed_out, self.over, self.ended = threading.Event(), threading.Event(), threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, wall_time_s: float) -> None:
        timer = threading.Timer(wall_time_s, self._past_wall_time)
        self.threads.append(timer)
        if self.output is not None and self.limit is not None:
            self.threads.append(threading.Thread(target=self._count_output, name="output-watchdog"))
        for thread in self.threads:
            thread.daemon = True
            thread.start()

    def _past_wall_time(self) -> None:
        if self.runtime.kill(self.container_id):
            self.timed_out.set()

    def _count_output(self) -> None:
        while not self.ended.wait(OUTPUT_CHECK_S):
            if self.output_over():
                self.over.set()  # before the kill: the run's end must find it set
                self.runtime.kill(self.container_id)
                return

    def output_over(self) -> bool:
        if self.output is None or self.limit is None:
            return False
        return folder_bytes(self.output, self.limit) > self.limit

    def stop(self) -> None:
        """The run ended: the watchdogs stop; a last count catches what was written since the previous one."""
        self.ended.set()
        for thread in self.threads:
            if isinstance(thread, threading.Timer):
                thread.cancel()
            thread.join(timeout=5)
        if not self.over.is_set() and self.output_over():
            self.over.set()
