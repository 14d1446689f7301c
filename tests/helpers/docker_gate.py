"""A gate in front of the real Docker engine: a Unix socket that passes every request and response through
unchanged, except one the test names, which it holds (before it reaches the engine, or its answer before it
reaches the caller) until the test lets it go. The code under test is pointed at it as at any engine
(``DOCKER_HOST``), so a test can act at an exact step of a container's start: after ``create`` was asked,
between ``create`` and ``start``, just after ``start``.

    with docker_gate() as gate:
        held = gate.hold("POST", r"/containers/[0-9a-f]+/start$")
        ... start the code under test in a thread ...
        held.wait_arrived()
        ... act ...
        held.release()
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 1 << 16


@dataclass
class Hold:
    """One request (method and a pattern of its path) to hold once: itself, or its response."""

    method: str
    path: re.Pattern[str]
    response: bool
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    target: str = ""  # the request's path, once it came

    def wait_arrived(self, timeout: float = 120) -> str:
        if not self.arrived.wait(timeout):
            raise AssertionError(f"no {self.method} {self.path.pattern} reached the gate within {timeout} s")
        return self.target

    def release(self) -> None:
        self.released.set()

    def stop(self) -> None:
        """Let it pass at once, whenever it comes (the test ends)."""
        self.released.set()


class _Connection:
    """One client connection: its requests parsed (to find the one to hold), the engine's bytes piped back."""

    def __init__(self, gate: DockerGate, client: socket.socket) -> None:
        self.gate, self.client = gate, client
        self.engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.engine.connect(gate.upstream)
        self.held_response: Hold | None = None

    def run(self) -> None:
        back = threading.Thread(target=self._back, daemon=True)
        back.start()
        try:
            self._forward()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self.engine.shutdown(socket.SHUT_WR)
            back.join(timeout=600)
            self.client.close()
            self.engine.close()

    def _read_more(self, pending: bytes) -> bytes:
        data = self.client.recv(BLOCK)
        if not data:
            raise ConnectionError("closed")
        return pending + data

    def _forward(self) -> None:
        pending = b""
        while True:
            while b"\r\n\r\n" not in pending:
                pending = self._read_more(pending)
            head, pending = pending.split(b"\r\n\r\n", 1)
            method, target = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")[:2]
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in head.decode("latin-1").split("\r\n")[1:])
            }
            hold = self.gate.take(method, target)
            if hold is not None and not hold.response:
                hold.arrived.set()
                hold.released.wait()
            self.held_response = hold if hold is not None and hold.response else None
            self.engine.sendall(head + b"\r\n\r\n")
            pending = self._body(headers, pending)
            if "upgrade" in headers.get("connection", "").lower():
                self.engine.sendall(pending)
                while data := self.client.recv(BLOCK):
                    self.engine.sendall(data)
                return

    def _body(self, headers: dict[str, str], pending: bytes) -> bytes:
        """Forward the request's body; returns what came after it."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                while b"\r\n" not in pending:
                    pending = self._read_more(pending)
                size = int(pending.split(b"\r\n", 1)[0].split(b";")[0], 16)
                whole = pending.index(b"\r\n") + 2 + size + 2
                while len(pending) < whole:
                    pending = self._read_more(pending)
                self.engine.sendall(pending[:whole])
                pending = pending[whole:]
                if size == 0:
                    return pending
        length = int(headers.get("content-length", "0") or 0)
        while len(pending) < length:
            pending = self._read_more(pending)
        self.engine.sendall(pending[:length])
        return pending[length:]

    def _back(self) -> None:
        try:
            while data := self.engine.recv(BLOCK):
                hold, self.held_response = self.held_response, None
                if hold is not None:
                    hold.arrived.set()
                    hold.released.wait()
                self.client.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self.client.shutdown(socket.SHUT_WR)


class DockerGate:
    def __init__(self, folder: Path, upstream: str) -> None:
        self.path = folder / "docker.sock"
        self.upstream = upstream
        self.holds: list[Hold] = []
        self.made: list[Hold] = []
        self.lock = threading.Lock()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.path))
        self.server.listen(64)
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def hold(self, method: str, path: str, response: bool = False) -> Hold:
        """Hold the next request of ``method`` whose path (without the API version) matches ``path``."""
        found = Hold(method, re.compile(path), response)
        with self.lock:
            self.holds.append(found)
            self.made.append(found)
        return found

    def take(self, method: str, target: str) -> Hold | None:
        """The hold this request meets, disarmed (each holds once); None if none."""
        path = re.sub(r"^/v[0-9.]+", "", target.split("?", 1)[0])
        with self.lock:
            for hold in self.holds:
                if hold.method == method and hold.path.search(path):
                    self.holds.remove(hold)
                    hold.target = path
                    return hold
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=_Connection(self, client).run, daemon=True).start()

    def release_all(self) -> None:
        """Let every hold pass, now and whenever it comes."""
        with self.lock:
            for hold in self.made:
                hold.stop()

    def close(self) -> None:
        self.release_all()
        self.server.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@contextlib.contextmanager
def docker_gate() -> Iterator[DockerGate]:
    """The gate, and every Docker client this process makes pointed at it (``DOCKER_HOST``) while it lasts.
    Its socket lies in a short folder of its own (a socket's path holds 107 bytes at most)."""
    upstream = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    folder = Path(tempfile.mkdtemp(prefix="docker-gate-"))
    gate = DockerGate(folder, upstream)
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = gate.url
    try:
        yield gate
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before
        gate.close()
        shutil.rmtree(folder, ignore_errors=True)
