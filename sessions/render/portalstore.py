"""The file store of a render worker on a GPU host that does not share the portal's disk (issue 32, item 3).

The worker fetches a job's scene from the portal over HTTP (``sessions.render.internal``) into its own scratch
folder (PORTAL_RENDER_SCRATCH_DIR), checks it against the checksum unpacking recorded, as the local store does,
and renders from there; each frame and thumbnail goes back to the portal in parts, checked there against the
checksum the worker read, into the job's folder, where people download them. Nothing of the portal's render
folder is read or written on the GPU host, and nothing of the host's scratch outlives the job there.

Every call carries a token the worker signs with PORTAL_FILE_STORE_KEY (a secret the portal and its GPU hosts
share, never a notebook's or a scene's): it names one job and the host, and lasts a few minutes. A leaked token
reaches only its job's files, and only for those minutes. A Kubernetes render Job has no key: the portal signs its
run a token that lasts until the Job's deadline (``sign_for_run``), which only its file-store containers mount
(``sessions.render.podfiles``).

The protocol, both sides' one definition:

- ``GET  jobs/<id>/scene/``: the scene's files (path and size of each, in order), its recorded sha256 and the
  job's estimate (the worker reads the size of its frames there);
- ``GET  jobs/<id>/scene/<path>``: one file of it;
- ``PUT  jobs/<id>/output/<path>?offset=<n>``: a part of a frame or thumbnail, at that offset;
- ``POST jobs/<id>/output/<path>`` with its ``size`` and ``sha256``: the file is whole; the portal checks it and
  moves it into place;
- ``POST jobs/<id>/measure/``: the job's share of its owner's quota measured again, after a run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import requests
from django.conf import settings
from django.core import signing

from sessions.render import files
from sessions.render.filestore import (
    ESTIMATE_FILE,
    LocalStore,
    SceneChanged,
    StoreUnreachable,
)
from sessions.render.models import RenderJob
from sessions.render.protocol import BLOCK, OUTPUT_PATH, PREFIX, scene_relative
from sessions.runtime.kube.jobs import STAGING_S
from sessions.runtime.render import Scene

log = logging.getLogger(__name__)
SALT = "gpu-portal.render-file-store"
TOKEN_AGE_S = 600
RUN_SALT = "gpu-portal.render-file-store.run"
TIMEOUT_S = (5, 60)  # to connect, and between two reads


def sign(job_id: int, host: str) -> str:
    """The token of a call about one job from one host's worker."""
    return signing.dumps({"job": job_id, "host": host}, key=settings.FILE_STORE_KEY, salt=SALT)


def sign_for_run(job_id: int, run: str, lasts_s: int) -> str:
    """The token a Kubernetes render Job's own file-store containers carry (``sessions.runtime.kube.jobs``): it
    names the job and the run and lasts until the Job's deadline, at most the chunks' wall time and
    STAGING_S. Nothing of the portal's key goes into the cluster, and Blender's container never mounts it."""
    lasts_s = min(lasts_s, settings.RENDER_CHUNK_WALL_SECONDS + STAGING_S)
    payload = {"job": job_id, "host": f"run:{run}", "until": int(time.time()) + lasts_s}
    return signing.dumps(payload, key=settings.FILE_STORE_KEY, salt=RUN_SALT)


def signed_host(token: str, job_id: int) -> str | None:
    """Who a token was signed for, if it is good and names this job; None otherwise. Good: the key, and not
    older than TOKEN_AGE_S (a host's worker), or than its own ``until`` (a Job's run)."""
    found = _loaded(token, SALT, TOKEN_AGE_S)
    if found is None:
        found = _loaded(token, RUN_SALT, settings.RENDER_CHUNK_WALL_SECONDS + STAGING_S)
        if found is None or not isinstance(found.get("until"), int) or found["until"] < time.time():
            return None
    if found.get("job") != job_id or not isinstance(found.get("host"), str):
        return None
    return str(found["host"])


def _loaded(token: str, salt: str, max_age: int) -> dict[str, Any] | None:
    try:
        found = signing.loads(token, key=settings.FILE_STORE_KEY, salt=salt, max_age=max_age)
    except signing.BadSignature:  # SignatureExpired among them
        return None
    return found if isinstance(found, dict) else None


class PortalStore(LocalStore):
    """Scenes fetched from the portal into this host's scratch, frames given back to it."""

    name = "portal"

    def __init__(self) -> None:
        super().__init__()  # settings refuse to start without PORTAL_FILE_STORE_URL and PORTAL_FILE_STORE_KEY
        self.base = f"{settings.FILE_STORE_URL.rstrip('/')}/{PREFIX}"
        self.root = Path(settings.RENDER_SCRATCH_DIR)
        self.host = str(settings.GPU_HOST_NAME)
        self._local = threading.local()  # one HTTP session per thread (requests' sessions are not shared)
        self._fetching: dict[tuple[int, str], threading.Lock] = {}

    # -- the scene

    def fetch_scene(self, job: RenderJob) -> Scene:
        """The job's scene in this host's scratch, fetched once per job and checked against the recorded
        checksum: SceneChanged if what the portal sent differs, StoreUnreachable if it did not answer."""
        if not job.scene_sha256:
            raise SceneChanged("its scene was never checked (no checksum was recorded when it was unpacked)")
        folder = self.scratch(job) / f"scene-{job.scene_sha256[:16]}"
        with self._lock_of(job):
            if not folder.is_dir():
                self._sweep()
                self._fetch(job, folder)
            return self.checked_scene(job, folder)

    def _lock_of(self, job: RenderJob) -> threading.Lock:
        with self._lock:
            return self._fetching.setdefault((job.pk, job.scene_sha256), threading.Lock())

    def _fetch(self, job: RenderJob, folder: Path) -> None:
        listed = self._json("get", job, "scene/")
        if listed.get("sha256") != job.scene_sha256:
            raise SceneChanged("the portal holds another scene for it than the one checked when it was unpacked")
        aside = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}")
        files.make_private(aside.parent)
        aside.mkdir(mode=0o700)
        try:
            total = 0
            for entry in listed.get("files", []):
                relative = scene_relative(str(entry["path"]))
                target = aside.joinpath(*relative.parts)
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                total += self._download(job, relative.as_posix(), target, int(entry["size"]))
            aside.rename(folder)
            if isinstance(listed.get("estimate"), dict):  # the probe's findings, which the worker reads
                (self.scratch(job) / ESTIMATE_FILE).write_text(json.dumps(listed["estimate"]))
        except BaseException:
            shutil.rmtree(aside, ignore_errors=True)
            raise
        log.info("render job %s: scene fetched from the portal into %s (%s bytes)", job.pk, folder, total)

    def _download(self, job: RenderJob, path: str, target: Path, size: int) -> int:
        written = 0
        with self._call("get", job, f"scene/{quote(path)}", stream=True) as answer:
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                for block in answer.iter_content(BLOCK):
                    written += len(block)
                    if written > size:
                        raise SceneChanged(f"the portal sent more of {path} than its {size} bytes")
                    out.write(block)
        if written != size:
            raise StoreUnreachable(f"the portal sent {written} of the {size} bytes of {path}")
        return written

    def _sweep(self) -> None:
        """The scratch of jobs that ended goes (one of this host's workers fetches again for a job re-queued)."""
        with contextlib.suppress(FileNotFoundError):
            held = {entry.name for entry in os.scandir(self.root) if entry.name.isdigit()}
            ended = RenderJob.objects.filter(pk__in=[int(name) for name in held], state__in=RenderJob.ENDED)
            for job_id in ended.values_list("pk", flat=True):
                files.remove_entry(self.root / str(job_id))
                with self._lock:
                    for key in [key for key in self._checked if key[0] == job_id]:
                        del self._checked[key]

    # -- the frames

    def scratch(self, job: RenderJob) -> Path:
        folder = self.root / str(job.pk)
        files.make_private(folder)
        return folder

    def keep(self, job: RenderJob, relative: str, opened: BinaryIO, sha256: str) -> str:
        """The file given back to the portal in parts of at most PORTAL_RENDER_UPLOAD_PART_BYTES (the portal
        holds a whole request in memory), then declared whole with its size and checksum, which the portal
        checks before it moves the file into place."""
        if not OUTPUT_PATH.fullmatch(relative):
            raise ValueError(f"{relative[:200]!r} is not a frame or thumbnail path the portal keeps")
        opened.seek(0)
        offset, part = 0, opened.read(settings.RENDER_UPLOAD_PART_BYTES)
        while True:  # at least one part: an empty file is sent as one empty part
            self._call("put", job, f"output/{relative}", params={"offset": offset}, data=part).close()
            offset += len(part)
            if not (part := opened.read(settings.RENDER_UPLOAD_PART_BYTES)):
                break
        opened.seek(0)
        kept = self._json("post", job, f"output/{relative}", json={"size": offset, "sha256": sha256})
        if kept.get("sha256") != sha256:
            raise StoreUnreachable(f"the portal kept {relative} with another checksum than the one read here")
        return sha256

    def run_ended(self, job: RenderJob, output: Path) -> None:
        """The run's frames are the portal's now: its folder here goes, and the thumbnails made here."""
        for made in (output, self.thumbnails_for(job)):
            with contextlib.suppress(FileNotFoundError):
                files.remove_entry(made)
        with contextlib.suppress(OSError):  # another run of the job's, on another thread, still writes there
            output.parent.rmdir()

    def measure(self, job: RenderJob) -> None:
        try:
            self._call("post", job, "measure/").close()
        except (StoreUnreachable, FileNotFoundError) as error:  # the portal's periodic measure catches it
            log.warning("render job %s: not measured again after its run: %s", job.pk, error)

    # -- HTTP

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _call(self, method: str, job: RenderJob, path: str, **options: Any) -> requests.Response:
        url = f"{self.base}/{job.pk}/{path}"
        headers = {"Authorization": f"Bearer {sign(job.pk, self.host)}"}
        try:
            answer = self._session().request(method, url, headers=headers, timeout=TIMEOUT_S, **options)
        except requests.RequestException as error:
            where = settings.FILE_STORE_URL
            raise StoreUnreachable(f"the portal's file store at {where} did not answer ({error})") from None
        if answer.status_code == 410:
            answer.close()
            raise FileNotFoundError(f"the portal no longer holds job {job.pk}'s files")
        if answer.status_code >= 400:
            why = _error_of(answer)
            answer.close()
            raise StoreUnreachable(f"the portal's file store refused {method.upper()} {path}: {why}")
        return answer

    def _json(self, method: str, job: RenderJob, path: str, **options: Any) -> dict[str, Any]:
        with self._call(method, job, path, **options) as answer:
            try:
                found = answer.json()
            except ValueError:
                found = None
        if not isinstance(found, dict):
            raise StoreUnreachable(f"the portal's file store answered {path} with something else than JSON")
        return found


def _error_of(answer: requests.Response) -> str:
    with contextlib.suppress(ValueError):
        found = answer.json()
        if isinstance(found, dict) and "error" in found:
            return f"{answer.status_code} {found['error']}"
    return f"{answer.status_code} {answer.reason}"
