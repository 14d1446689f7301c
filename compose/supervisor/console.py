"""Follow the programs' log files under supervisord and print each new line as ``name | line``; say the
portal's address once it answers.

supervisord writes each program's output to <data dir>/logs/<name>.log; this keeps the live view a
terminal had before. A file that is rotated or truncated is read again from its start. The address
(http://127.0.0.1:$PORTAL_PORT/) is printed once its /healthz answers 200 through the proxy: printed
before, the first person to open it met the proxy's 503 while daphne was still starting.
Usage: console.py LOG_DIR NAME [NAME ...]
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

POLL_S = 0.2


class Follower:
    """One log file: where we are in it and which file (inode) that position belongs to."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label
        self.inode: int | None = None
        self.offset = 0
        self.partial = b""
        # What was there before we started is old news; a file made later is read from its start.
        if path.exists():
            stat = path.stat()
            self.inode, self.offset = stat.st_ino, stat.st_size

    def new_lines(self) -> list[bytes]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        if stat.st_ino != self.inode or stat.st_size < self.offset:
            self.inode, self.offset, self.partial = stat.st_ino, 0, b""
        if stat.st_size == self.offset:
            return []
        with self.path.open("rb") as log:
            log.seek(self.offset)
            chunk = log.read(stat.st_size - self.offset)
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return lines


def terminal() -> BinaryIO:
    """supervisord's own standard output (the terminal, or the pipe `make run | tee` made), written directly.

    What this program prints to its stdout passes through supervisord, which would hide from us that
    the reader is gone; written straight to the same file we see it (BrokenPipeError) and can act.
    """
    try:
        return open(f"/proc/{os.getppid()}/fd/1", "ab", buffering=0)
    except OSError:
        return sys.stdout.buffer


class Address:
    """The portal's public address, said once it answers (checked at most every half second until then)."""

    def __init__(self, port: str) -> None:
        self.url = f"http://127.0.0.1:{port}/"
        self.said = False
        self.checked = 0.0

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}healthz", timeout=1) as answer:  # noqa: S310 (our own address)
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def words(self) -> bytes | None:
        """The lines to print now: the address once it first answers, else nothing."""
        if self.said or time.monotonic() - self.checked < 0.5:
            return None
        self.checked = time.monotonic()
        if not self.answers():
            return None
        self.said = True
        return f"\n  GPU portal: open {self.url}  (Ctrl-C stops every process)\n\n".encode()


def main(log_dir: str, names: list[str]) -> None:
    width = max(len(name) for name in names)
    followers = [Follower(Path(log_dir) / f"{name}.log", name.ljust(width)) for name in names]
    address = Address(os.environ.get("PORTAL_PORT", "8000"))
    out = terminal()
    while True:
        try:
            for follower in followers:
                for line in follower.new_lines():
                    out.write(follower.label.encode() + b" | " + line.rstrip(b"\r") + b"\n")
            if said := address.words():
                out.write(said)
            out.flush()
        except BrokenPipeError:
            # Whoever read the console is gone (a pipe whose reader was stopped with Ctrl-C): the person
            # meant to stop the portal, so stop the supervisor, which stops every program.
            os.kill(os.getppid(), signal.SIGTERM)
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    with contextlib.suppress(KeyboardInterrupt):  # stopsignal=INT: a quiet stop
        main(sys.argv[1], sys.argv[2:])
