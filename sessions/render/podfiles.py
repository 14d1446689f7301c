"""A Kubernetes render Job's own file-store containers (``sessions.runtime.kube.jobs``), run from the portal's
image with no Django, no database and no key: only the one token the portal signed for the run
(``sessions.render.portalstore.sign_for_run``), mounted from the run's Secret into these two containers alone.

- ``fetch`` (the Job's init container): the job's scene from the portal into the pod's scene volume, each file
  bounded by the size the portal listed and the whole by GPU_PORTAL_SCENE_BYTES, checked against the checksum
  unpacking recorded (GPU_PORTAL_SCENE_SHA256), which the portal's list must name too. Blender starts only
  once this ended well.
- ``give-back`` (a sidecar: an init container that runs beside Blender): waits for the kubelet's SIGTERM, which
  comes once Blender's container ended (or the Job's deadline passed), then gives every plain file of the
  output volume back to the portal as ``frames/<run>/<name>``, in parts, each declared whole with its size and
  checksum, and prints one JSON line per file: what the render worker reads from this container's log.

Either failure is said on stderr and in the kubelet's termination message, which the worker shows; the exit
status is 1. Environment: GPU_PORTAL_FILE_STORE_URL (the portal as the cluster reaches it), GPU_PORTAL_JOB,
GPU_PORTAL_TOKEN_FILE, GPU_PORTAL_PART_BYTES; ``python -m sessions.render.podfiles --help`` says the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from sessions.render.protocol import BLOCK, PLAIN_NAME, PREFIX, checksum_line, scene_relative

TOKEN_FILE = "/run/gpu-portal/token"  # noqa: S105 (a path: the run's Secret, mounted there)
TERMINATION_LOG = "/dev/termination-log"
TIMEOUT_S = (5, 60)
PART_BYTES = 8 * 1024**2


class Refused(Exception):
    """The run cannot go on; the message says why, to the job's owner as much as to an operator."""


class Store:
    """The portal's file store, as one run's token reaches it."""

    def __init__(self, environ: dict[str, str]) -> None:
        try:
            url, self.job = environ["GPU_PORTAL_FILE_STORE_URL"], int(environ["GPU_PORTAL_JOB"])
            token = Path(environ.get("GPU_PORTAL_TOKEN_FILE", TOKEN_FILE)).read_text().strip()
            self.part_bytes = int(environ.get("GPU_PORTAL_PART_BYTES", PART_BYTES))
        except (KeyError, ValueError, OSError) as error:
            raise Refused(f"this container is not set up as a render Job's (GPU_PORTAL_*): {error}") from None
        self.base = f"{url.rstrip('/')}/{PREFIX}/{self.job}"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, **options: Any) -> requests.Response:
        try:
            answer = self.session.request(method, f"{self.base}/{path}", timeout=TIMEOUT_S, **options)
        except requests.RequestException as error:
            raise Refused(f"the portal's file store did not answer ({error})") from None
        if answer.status_code >= 400:
            answer.close()
            why = "the job's files are gone" if answer.status_code == 410 else f"{answer.status_code}"
            raise Refused(f"the portal's file store refused {method.upper()} {path}: {why}")
        return answer

    def json(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        with self.call(method, path, **options) as answer:
            try:
                found = answer.json()
            except ValueError:
                found = None
        if not isinstance(found, dict):
            raise Refused(f"the portal's file store answered {path} with something else than JSON")
        return found


def fetch(store: Store, into: Path, expected: str, most_bytes: int) -> int:
    """The scene into ``into`` (an empty folder), checked; the bytes fetched."""
    listed = store.json("get", "scene/")
    if not expected or listed.get("sha256") != expected:
        raise Refused("the portal holds another scene for this job than the one its run was made for")
    total, checksum = 0, hashlib.sha256()
    for entry in listed.get("files", []):
        relative, size = scene_relative(str(entry.get("path", ""))), int(entry.get("size", -1))
        if size < 0 or total + size > most_bytes:
            raise Refused(f"the scene is larger than this run may fetch ({most_bytes} bytes)")
        target = into.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        content = hashlib.sha256()
        with store.call("get", f"scene/{quote(relative.as_posix())}", stream=True) as answer:
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(descriptor, "wb") as out:
                written = 0
                for block in answer.iter_content(BLOCK):
                    written += len(block)
                    if written > size:
                        raise Refused(f"the portal sent more of {relative} than its {size} bytes")
                    content.update(block)
                    out.write(block)
        if written != size:
            raise Refused(f"the portal sent {written} of the {size} bytes of {relative}")
        checksum.update(checksum_line(relative.as_posix(), size, content.hexdigest()))
        total += size
    if checksum.hexdigest() != expected:
        raise Refused("the scene fetched is not the one checked when it was unpacked")
    return total


def give_back(store: Store, output: Path, run: str) -> Iterator[dict[str, Any]]:
    """Every plain file directly in ``output`` given back as ``frames/<run>/<name>``; what became of each, as
    it goes."""
    for entry in sorted(os.scandir(output), key=lambda entry: entry.name):
        if not PLAIN_NAME.fullmatch(entry.name):
            yield {"skipped": entry.name[:200], "why": "not a plain name"}
            continue
        try:
            descriptor = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:  # a link: nothing of it is read
            yield {"skipped": entry.name, "why": "not a plain file"}
            continue
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # a folder, a FIFO: nothing of it is read
            os.close(descriptor)
            yield {"skipped": entry.name, "why": "not a plain file"}
            continue
        with os.fdopen(descriptor, "rb") as opened:
            yield _sent(store, f"frames/{run}/{entry.name}", opened)


def _sent(store: Store, relative: str, opened: Any) -> dict[str, Any]:
    content, offset = hashlib.sha256(), 0
    while True:  # at least one part: an empty file is sent as one empty part
        part = opened.read(store.part_bytes)
        content.update(part)
        store.call("put", f"output/{relative}", params={"offset": offset}, data=part).close()
        offset += len(part)
        if len(part) < store.part_bytes:
            break
    kept = store.json("post", f"output/{relative}", json={"size": offset, "sha256": content.hexdigest()})
    if kept.get("sha256") != content.hexdigest():
        raise Refused(f"the portal kept {relative} with another checksum than the one read here")
    return {"kept": relative, "size": offset, "sha256": content.hexdigest()}


def _until_told_to_end() -> None:
    """The kubelet's SIGTERM: Blender's container ended (or the pod is being stopped)."""
    ending = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, ending)
    signal.sigwait(ending)


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessions.render.podfiles", description=__doc__.split("\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    fetching = steps.add_parser("fetch", help="the scene into the pod's scene volume")
    fetching.add_argument("--into", type=Path, default=Path("/scene"))
    fetching.add_argument("--most-bytes", type=int, required=True)
    giving = steps.add_parser("give-back", help="the output volume's files back to the portal")
    giving.add_argument("--from", dest="output", type=Path, default=Path("/out"))
    giving.add_argument("--run", required=True, type=_plain)
    giving.add_argument("--now", action="store_true", help="at once, not on SIGTERM")
    given = parser.parse_args(argv)
    environ = dict(os.environ if environ is None else environ)
    try:
        store = Store(environ)
        if given.step == "fetch":
            total = fetch(store, given.into, environ.get("GPU_PORTAL_SCENE_SHA256", ""), given.most_bytes)
            print(json.dumps({"fetched": total}), flush=True)
        else:
            if not given.now:
                _until_told_to_end()
            for said in give_back(store, given.output, given.run):
                print(json.dumps(said), flush=True)
    except (Refused, ValueError) as error:
        _say(str(error), environ.get("GPU_PORTAL_TERMINATION_LOG", TERMINATION_LOG))
        return 1
    return 0


def _plain(run: str) -> str:
    if not PLAIN_NAME.fullmatch(run):
        raise argparse.ArgumentTypeError(f"a run is named with a plain name (got {run[:100]!r})")
    return run


def _say(message: str, termination_log: str) -> None:
    print(message, file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        Path(termination_log).write_text(message[:4000])


if __name__ == "__main__":
    sys.exit(main())
