"""What a compromised sandbox could do while a chunk renders, done for real inside the chunk's container: a
process run there as the container's own user (``docker exec``), writing into its /out and printing on the
container's output, as Blender would if a scene found a way to run code in it.

    with alongside(lambda: act_in_chunk(job, replace_and_say(...))):
        chunks.work_on_slice(job.pk, held.pk)   # the portal's side, in this process
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator

from django.db import connection
from PIL import Image

from sessions.render.models import RenderJob
from tests.render.stack import DOCKER, containers_of

# Swaps each named file in /out between the file Blender wrote and a link to a host path, as fast as it can,
# until the container ends: whatever the portal checks first, what it opens next may be the other one. Half
# the names point to argv[1], the other half to argv[2]; the flips go name by name, all to links, then all
# back to the files, so each name is a link about half the time.
FLIPPER = """
import os, sys
names, targets = sys.argv[3:], sys.argv[1:3]
kept = {}
while True:
    for number, name in enumerate(names):
        path = "/out/" + name
        if name not in kept:
            try:
                os.link(path, "/out/.kept-" + name)
            except OSError:
                continue
            kept[name] = "/out/.kept-" + name
        os.symlink(targets[number % 2], "/out/.link-" + name)
        os.rename("/out/.link-" + name, path)
    for name, real in kept.items():
        os.link(real, "/out/.back-" + name)
        os.rename("/out/.back-" + name, "/out/" + name)
"""


def running_container(job: RenderJob, timeout: float = 120, other_than: tuple[str, ...] = ()) -> str:
    """The job's chunk container (not one of ``other_than``), once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for container in set(containers_of(job)) - set(other_than):
            state = subprocess.run(
                [DOCKER, "inspect", "--format", "{{.State.Running}}", container], capture_output=True, text=True
            )
            if state.stdout.strip() == "true":
                return container
        time.sleep(0.05)
    raise AssertionError(f"no running container of job {job.pk} within {timeout} s")


def exec_in(container: str, command: list[str], stdin: bytes = b"", detach: bool = False) -> None:
    """Run a command in the container as its own user (the sandbox's)."""
    flags = ["-d"] if detach else ["-i"]
    result = subprocess.run([DOCKER, "exec", *flags, container, *command], input=stdin, capture_output=True)
    assert result.returncode == 0, result.stderr.decode(errors="replace")


def kill(container: str) -> None:
    """The container dies (as if the engine or the host killed it); the sandbox runner removes it."""
    subprocess.run([DOCKER, "kill", container], capture_output=True, check=False)


def write_in(container: str, name: str, data: bytes) -> None:
    """The sandbox writes a file into its /out."""
    exec_in(container, ["sh", "-c", f"cat > /out/{name}"], stdin=data)


def say_in(container: str, line: str) -> None:
    """The sandbox prints a line on the container's output, where the portal reads Blender's."""
    exec_in(container, ["sh", "-c", 'printf "%s\\n" "$1" > /proc/1/fd/1', "say", line])


def flip_in(container: str, names: list[str], targets: tuple[str, str]) -> None:
    """Start the flipper (above) in the container; it runs until the container ends."""
    exec_in(container, ["python3", "-c", FLIPPER, *targets, *names], detach=True)


@contextlib.contextmanager
def alongside(action: Callable[[], object], before_join: Callable[[], None] | None = None) -> Iterator[None]:
    """Run ``action`` in a thread while the block runs; its failure fails the test. ``before_join`` is called
    when the block ends, however it ends (to let go of whatever the thread may wait for)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as error:
            failures.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        if before_join is not None:
            before_join()
        thread.join(timeout=300)
    if failures:
        raise failures[0]


def png(width: int, height: int, colour: tuple[int, int, int] = (0, 0, 0)) -> bytes:
    """A PNG of one colour, made by Pillow."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "PNG")
    return out.getvalue()


def large_png(width: int, height: int) -> bytes:
    """A valid black greyscale PNG of ``width`` x ``height``, written row by row so it is never held decoded:
    small on disk, large once decoded."""
    row = b"\x00" * (width + 1)  # filter byte 0, then the row's pixels
    packer = zlib.compressobj(9)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def other_format(kind: str, width: int = 64, height: int = 48) -> bytes:
    """An image Pillow reads that is no PNG (``BMP``, ``GIF``, ``TIFF`` ...)."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (255, 0, 0)).save(out, kind)
    return out.getvalue()
