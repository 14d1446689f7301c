# ruff: noqa: F811 (the fixtures imported from tests.render.stack are parameters by name)
"""The render file store of a GPU host that does not share the portal's disk (issue 32, item 3), on the real
stack: the portal under daphne serves a job's scene and takes its frames back over HTTP, each call signed for
its job; the slice's worker runs here with the portal store, rendering from its own scratch folder.

The lab (tests/lab/test_lab_render.py) runs the same worker in other hosts' namespaces with no render folder
at all; here each call's refusals are tried one by one."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User
from pytest_django.fixtures import Settings

from sessions.render import chunks, filestore, jobs, stores
from sessions.render.models import RenderFrame, RenderJob
from sessions.render.portalstore import PortalStore, sign
from tests.render.stack import (  # noqa: F401 (fixtures)
    make_job,
    own_folder,
    queued_as_one_chunk,
    render_image,
    render_portal_server,
    render_root,
    render_stack,
    render_worker,
    scenes,
)

pytestmark = [pytest.mark.docker, pytest.mark.celery, pytest.mark.django_db(transaction=True)]
State = RenderJob.State


@pytest.fixture
def scratch() -> Iterator[Path]:
    with own_folder("scratch") as folder:
        yield folder


@pytest.fixture
def away(settings: Settings, render_portal_server: str, scratch: Path) -> Iterator[PortalStore]:
    """This process renders as a GPU host's worker would: through the portal, into its own scratch."""
    settings.RENDER_FILE_STORE, settings.FILE_STORE_URL = "portal", render_portal_server
    settings.RENDER_SCRATCH_DIR, settings.GPU_HOST_NAME = scratch, "far-host"
    store = stores.current()
    assert isinstance(store, PortalStore)
    yield store
    stores._stores.clear()  # the next test's settings make their own


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_worker_away_from_the_portals_disk_renders_a_fetched_scene_and_gives_its_frames_back(
    render_stack: Path, scenes: Path, alice: User, settings: Settings, away: PortalStore, scratch: Path
) -> None:
    settings.RENDER_CHUNK_ATTEMPTS = 1
    job, held = queued_as_one_chunk(alice, scenes / "small.blend", [1, 2, 3], (64, 48))

    chunks.work_on_slice(job.pk, held.pk)

    job.refresh_from_db()
    assert job.state == State.DONE, job.failure_message
    fetched = scratch / str(job.pk) / f"scene-{job.scene_sha256[:16]}"
    assert filestore.scene_checksum(fetched)[0] == job.scene_sha256, "the scene it rendered is the one checked"
    for frame in RenderFrame.objects.filter(job=job):
        kept = job.folder_path() / frame.output_path
        assert kept.is_file() and sha256_of(kept) == frame.sha256, f"frame {frame.number} is the portal's, whole"
        assert (job.folder_path() / frame.thumbnail_path).is_file(), f"frame {frame.number}'s thumbnail came back"
    assert sorted(path.name for path in (scratch / str(job.pk)).iterdir()) == ["estimate.json", fetched.name], (
        "the host keeps only the scene and the estimate: frames, thumbnails and parts are the portal's"
    )
    assert not list(job.folder_path().rglob(".*.part")), "no part is left in the job's folder"

    other = make_job(alice, scenes / "small.blend", [1], State.QUEUED)
    away.fetch_scene(other)  # a later fetch sweeps the scratch of jobs that ended
    assert not (scratch / str(job.pk)).exists()


def test_the_file_store_answers_only_calls_signed_for_their_job_and_keeps_only_what_arrived_whole(
    render_stack: Path, scenes: Path, alice: User, settings: Settings, render_portal_server: str
) -> None:
    job = make_job(alice, scenes / "small.blend", [1], State.QUEUED)
    other = make_job(alice, scenes / "small.blend", [1], State.QUEUED)
    base = f"{render_portal_server}/internal/render/jobs/{job.pk}"

    signed = sign(job.pk, "far-host")

    def call(method: str, path: str, token: str | None = signed, **options: object) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return requests.request(method, f"{base}/{path}", headers=headers, timeout=30, **options)  # type: ignore[arg-type]

    listed = call("get", "scene/")
    assert listed.status_code == 200 and listed.json() == {
        "sha256": job.scene_sha256,
        "files": [{"path": "scene.blend", "size": (job.scene_path() / "scene.blend").stat().st_size}],
        "estimate": None,  # none was made for it
    }
    assert call("get", "scene/scene.blend").content == (job.scene_path() / "scene.blend").read_bytes()
    for token in (None, "", sign(other.pk, "far-host"), sign(job.pk, "far-host") + "x"):
        refused = call("get", "scene/", token=token)
        assert refused.status_code == 403, f"a call signed {token!r} was answered"
    own_key, settings.FILE_STORE_KEY = settings.FILE_STORE_KEY, "another portal's key, long enough to be a key"
    assert call("get", "scene/", token=sign(job.pk, "far-host")).status_code == 403, "another key's token"
    settings.FILE_STORE_KEY = own_key

    assert call("get", "scene/..%2F..%2Fetc%2Fpasswd").status_code in (400, 404)
    assert call("get", "scene/nothing.blend").status_code == 404

    frame = b"\x89PNG not really, but bytes"
    digest = hashlib.sha256(frame).hexdigest()
    for bad in ("scene/scene.blend", "frames/run/../x.png", "frames/.hidden", "estimate.json", "frames/a/b/c.png"):
        assert call("put", f"output/{bad}", params={"offset": 0}, data=frame).status_code in (400, 404), bad
    assert filestore.scene_checksum(job.scene_path())[0] == job.scene_sha256, "the scene is untouched"

    assert call("put", "output/frames/run1/f.png", params={"offset": 5}, data=frame).status_code == 409
    assert call("put", "output/frames/run1/f.png", params={"offset": 0}, data=frame[:10]).status_code == 200
    assert call("put", "output/frames/run1/f.png", params={"offset": 10}, data=frame[10:]).status_code == 200
    wrong = call("post", "output/frames/run1/f.png", json={"size": len(frame), "sha256": "0" * 64})
    assert wrong.status_code == 422 and not (job.folder_path() / "frames/run1/f.png").exists()

    assert call("put", "output/frames/run1/f.png", params={"offset": 0}, data=frame).status_code == 200
    kept = call("post", "output/frames/run1/f.png", json={"size": len(frame), "sha256": digest})
    assert kept.json() == {"path": "frames/run1/f.png", "sha256": digest}
    assert (job.folder_path() / "frames/run1/f.png").read_bytes() == frame
    again = call("post", "output/frames/run1/f.png", json={"size": len(frame), "sha256": digest})
    assert again.status_code == 200, "a declaration sent again after a lost answer finds the file kept"
    assert call("post", "output/frames/run1/f.png", json={"size": "many"}).status_code == 400

    jobs.remove_files(job)
    assert call("get", "scene/").status_code == 410
    assert call("put", "output/frames/run1/g.png", params={"offset": 0}, data=frame).status_code == 410
    assert not job.folder_path().exists(), "nothing is made again for a job whose files are gone"
