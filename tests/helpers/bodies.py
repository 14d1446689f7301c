"""Sending a large request body by hand and watching the portal's processes while it goes.

The body is made on the fly from one block of zeros (nothing of it is kept on disk), sent over a raw socket
with Content-Length or chunked, and the answer is read as soon as one comes, while the body is still
being sent, as a browser or curl does. Each process's resident memory is read from /proc every few
milliseconds meanwhile.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

MiB = 1024 * 1024
BLOCK = bytes(MiB)


def rss_bytes(pid: int) -> int:
    """A process's resident memory, as the kernel counts it (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return 0
    return 0


@dataclass
class MemoryWatch:
    """The highest resident memory seen of each named process while the watch runs."""

    pids: dict[str, int]
    peaks: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        for name, pid in self.pids.items():
            self.peaks[name] = max(self.peaks.get(name, 0), rss_bytes(pid))

    def over(self, bounds: dict[str, int]) -> str:
        """Which process passed its bound, in words; empty while none has."""
        return ", ".join(
            f"{name} reached {self.peaks.get(name, 0) / MiB:.0f} MiB (bound {bound / MiB:.0f} MiB)"
            for name, bound in bounds.items()
            if self.peaks.get(name, 0) > bound
        )


@contextlib.contextmanager
def watching(pids: dict[str, int], every: float = 0.02) -> Iterator[MemoryWatch]:
    watch = MemoryWatch(pids)
    watch.sample()

    def run() -> None:
        while not watch.stop.wait(every):
            watch.sample()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        watch.stop.set()
        thread.join()
        watch.sample()


@dataclass
class Sent:
    """What happened to one body: the answer's status (None: the connection was closed with no answer), how
    much had been sent when the answer came, and when (monotonic seconds) the body passed ``limit``."""

    status: int | None
    sent: int
    passed_limit_at: float | None
    answered_at: float
    answer: bytes = b""
    stopped: str = ""  # why the sender gave up before an answer came

    def seconds_after_limit(self) -> float:
        return self.answered_at - (self.passed_limit_at or self.answered_at)


def send_body(
    port: int,
    path: str,
    total: int,
    *,
    limit: int,
    chunked: bool,
    headers: dict[str, str] | None = None,
    give_up: Callable[[], str] = lambda: "",
    deadline_s: float = 120,
) -> Sent:
    """POST ``total`` bytes of zeros to 127.0.0.1:``port``; stop at the first answer, a closed connection,
    ``give_up`` saying why, or the deadline."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{framing}\r\n{extra}"
    head += "Content-Type: application/offset+octet-stream\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.setblocking(False)
        return _exchange(connection, head.encode(), total, limit, chunked, give_up, time.monotonic() + deadline_s)


def _exchange(
    connection: socket.socket,
    head: bytes,
    total: int,
    limit: int,
    chunked: bool,
    give_up: Callable[[], str],
    deadline: float,
) -> Sent:
    pending, sent, passed = memoryview(head), 0, None
    answer = b""
    while time.monotonic() < deadline:
        if why := give_up():
            return Sent(None, sent, passed, time.monotonic(), answer, stopped=why)
        want_write = sent < total or bool(pending)
        readable, writable, _ = select.select([connection], [connection] if want_write else [], [], 0.5)
        if readable:
            answer, closed = _read(connection, answer)
            if b"\r\n\r\n" in answer or closed:
                return Sent(_status(answer), sent, passed, time.monotonic(), answer)
        if writable:
            if not pending:
                block = BLOCK[: min(len(BLOCK), total - sent)]
                framed = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
                if chunked and sent + len(block) >= total:
                    framed += b"0\r\n\r\n"
                pending, sent = memoryview(framed), sent + len(block)
                if passed is None and sent > limit:
                    passed = time.monotonic()
            try:
                pending = pending[connection.send(pending) :]
            except (BrokenPipeError, ConnectionResetError):
                answer, _ = _read_after_reset(connection, answer)
                return Sent(_status(answer), sent, passed, time.monotonic(), answer)
    return Sent(None, sent, passed, time.monotonic(), answer, stopped="no answer before the deadline")


def _read(connection: socket.socket, answer: bytes) -> tuple[bytes, bool]:
    try:
        data = connection.recv(65536)
    except (BlockingIOError, InterruptedError):
        return answer, False
    except ConnectionResetError:
        return answer, True
    return answer + data, not data


def _read_after_reset(connection: socket.socket, answer: bytes) -> tuple[bytes, bool]:
    """What the server wrote before it stopped reading is still in our socket's buffer."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and b"\r\n\r\n" not in answer:
        readable, _, _ = select.select([connection], [], [], 0.2)
        if readable:
            answer, closed = _read(connection, answer)
            if closed:
                break
    return answer, True


def _status(answer: bytes) -> int | None:
    if not answer.startswith(b"HTTP/1."):
        return None
    return int(answer.split(b" ", 2)[1])
