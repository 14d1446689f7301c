"""Child process of the render benchmark: one render job through the portal, from its confirmation on.

Usage: ``python -m bench.render_job SCENE FRAMES CHUNK_SIZE SLICES WORKER...``. Waits until the named
Celery workers answer, writes a job whose upload was checked and whose estimate waits for confirmation
(the probe is not timed: the issue times from "queued"), confirms it through ``services.confirm`` as the
job page does, and follows its rows until every frame is saved or the job ended. Prints one JSON line:
the job's moments (queued, each chunk's start and end, each frame's save), its frames' files' times, and
whether every frame came out.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402

from portal import roles  # noqa: E402
from portal.celery import app  # noqa: E402
from sessions.render import filestore, services  # noqa: E402
from sessions.render.models import RenderChunk, RenderFrame, RenderJob  # noqa: E402

MIG_OFFER = {"gpu_kind": "mig", "gpu_profile": "1g.18gb", "gpu_model": "H200-SXM5-141GB"}
TIMEOUT_S = 600


def workers_answer(names: list[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answered = {name for reply in app.control.ping(destination=names, timeout=1) for name in reply}
        if answered >= set(names):
            return
        time.sleep(0.5)
    raise SystemExit(f"the Celery workers {names} did not answer within 60 s")


def bench_user(username: str) -> User:
    """The benchmark's person, in the group that may start render jobs (confirm asks, as for anyone)."""
    owner, _ = User.objects.get_or_create(username=username)
    owner.groups.add(Group.objects.get_or_create(name=roles.USERS)[0])
    return owner


def new_job(
    owner: User,
    scene: Path,
    frames: list[int],
    chunk_size: int,
    slices: int,
    state: str = RenderJob.State.AWAITING_CONFIRMATION,
    **fields: Any,
) -> RenderJob:
    """A job as the upload page leaves it (awaiting confirmation unless ``state`` says), its scene copied in."""
    job = RenderJob(
        owner=owner,
        state=state,
        upload_name=scene.name,
        folder=f"bench/{secrets.token_hex(8)}",
        main_file="scene.blend",
        frame_spec=f"{frames[0]}-{frames[-1]}",
        frames=frames,
        frame_count=len(frames),
        resolution_percent=100,
        chunk_size=chunk_size,
        max_slices=slices,
        **MIG_OFFER,
        **fields,
    )
    job.scene_path().mkdir(parents=True)
    shutil.copy(scene, job.scene_path() / "scene.blend")
    job.scene_sha256 = filestore.scene_checksum(job.scene_path())[0]  # as unpacking records it
    job.save(force_insert=True)
    return job


def stamp(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def main(argv: list[str]) -> int:
    scene, count, chunk_size, slices, workers = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), argv[4:]
    workers_answer(workers)
    owner = bench_user("bench-render")
    frames = list(range(1, count + 1))
    job = new_job(owner, scene, frames, chunk_size, slices)
    clicked = time.time()
    services.confirm(job.pk, owner)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        job.refresh_from_db()
        done = RenderFrame.objects.filter(job=job, state=RenderFrame.State.DONE).count()
        if done == count or job.state in RenderJob.ENDED:
            break
        time.sleep(0.1)
    seen_all = time.time()
    while time.monotonic() < deadline and job.state not in RenderJob.ENDED:  # the last chunk's row, after its frames
        time.sleep(0.1)
        job.refresh_from_db()
    rows = list(RenderFrame.objects.filter(job=job).order_by("number"))
    files = {row.number: job.folder_path() / row.output_path for row in rows if row.output_path}
    chunks = list(RenderChunk.objects.filter(job=job).order_by("index"))
    print(
        json.dumps(
            {
                "job": job.pk,
                "state": job.state,
                "failure": job.failure_message[:2000],
                "clicked": clicked,
                "seen_all": seen_all,
                "queued_at": stamp(job.queued_at),
                "finished_at": stamp(job.finished_at),
                "frames_done": sum(row.state == RenderFrame.State.DONE for row in rows),
                "frames_with_file": sum(path.is_file() for path in files.values()),
                "frame_saved_at": [stamp(row.finished_at) for row in rows],
                "frame_mtimes": sorted(path.stat().st_mtime for path in files.values() if path.is_file()),
                "chunks": [
                    {
                        "frames": len(chunk.frames),
                        "state": chunk.state,
                        "attempts": chunk.attempts,
                        "slice": chunk.slice_id,
                        "started_at": stamp(chunk.started_at),
                        "finished_at": stamp(chunk.finished_at),
                    }
                    for chunk in chunks
                ],
            }
        )
    )
    shutil.rmtree(job.folder_path(), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
