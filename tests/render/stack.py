"""The real render stack for lifecycle tests: the render image, scenes Blender makes in it, a Celery worker
on the render queue (threads, as the supervisor runs it), and jobs written straight into the database at
the step a test starts from.

Import the fixtures into a test module by name (``from tests.render.stack import render_worker ...``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Sum

from billing.models import Account, ChargedMinute, Entry, LedgerTransaction, Usage
from portal.celery import app, estimate_queue, render_queue
from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.holders import Holder, HolderKind
from sessions.gpus.models import Slice
from sessions.render import filestore, services
from sessions.render.models import RenderChunk, RenderFrame, RenderJob
from sessions.runtime.render import RENDER_IMAGE
from sessions.runtime.scene_facts import SceneFacts
from sessions.runtime.spec import INSTANCE_LABEL
from tests.conftest import ARTIFACTS, RENDER_ROOT, RUN_ID
from tests.gpus.conftest import use_fleet
from tests.helpers import processes
from tests.helpers.processes import BIN, ROOT

DOCKER = "/usr/bin/docker"
CHUNK_ATTEMPTS = 2  # the render worker's PORTAL_RENDER_CHUNK_ATTEMPTS in these tests
RENDER_THREADS = 2  # the render worker's threads in these tests (the supervisor's: one per core)
ESTIMATE_THREADS = 2  # the estimate worker's (the supervisor's PORTAL_ESTIMATE_CONCURRENCY)
MIG_OFFER = {"gpu_kind": "mig", "gpu_profile": "1g.18gb", "gpu_model": "H200-SXM5-141GB"}

# Scripts Blender runs in the image (trusted, outside our sandbox) to make test scenes in /out.
SMALL_SCENE = """
import bpy
scene = bpy.context.scene
scene.render.engine = "CYCLES"
scene.cycles.samples = 4
scene.render.resolution_x, scene.render.resolution_y, scene.render.resolution_percentage = 64, 48, 100
scene.frame_start, scene.frame_end = 1, 3
cube = bpy.data.objects["Cube"]
cube.keyframe_insert("rotation_euler", frame=1)
cube.rotation_euler[2] = 1.5
cube.keyframe_insert("rotation_euler", frame=3)
bpy.ops.wm.save_as_mainfile(filepath="/out/small.blend")
"""
# Many samples at a larger size: a frame takes long enough to cancel the job while it renders.
SLOW_SCENE = (
    SMALL_SCENE.replace("samples = 4", "samples = 4096")
    .replace("64, 48, 100", "320, 240, 100")
    .replace("small.blend", "slow.blend")
)
# Frames that take hours: a million samples, every one taken (no adaptive sampling stops them early).
ENDLESS_SCENE = SMALL_SCENE.replace(
    "samples = 4", "samples = 1 << 20\nscene.cycles.use_adaptive_sampling = False"
).replace("small.blend", "endless.blend")
# A large frame: even the probe's 4 samples take half a minute, long enough to cancel the job while it runs.
BIG_SCENE = SMALL_SCENE.replace("64, 48, 100", "4000, 3000, 100").replace("small.blend", "big.blend")
# Wider than the portal renders (PORTAL_RENDER_MAX_RESOLUTION, 16384 by default), and quick to render.
WIDE_SCENE = SMALL_SCENE.replace("64, 48, 100", "20000, 16, 100").replace("small.blend", "wide.blend")
# No camera: Blender reads the file, then refuses to render any frame of it.
NO_CAMERA_SCENE = SMALL_SCENE.replace(
    'cube = bpy.data.objects["Cube"]',
    'bpy.data.objects.remove(bpy.data.objects["Camera"])\ncube = bpy.data.objects["Cube"]',
).replace("small.blend", "no-camera.blend")

# What an attacker would hide in a scene: a registered text block (run when the file is loaded, if scripts
# may run) that writes a marker, opens a connection and makes the scene render 17 pixels wide, and a scripted
# driver that writes another marker. The markers go to /out (the probe's or the frames' folder); the width
# shows in the scene's facts and in every frame, so a run whose /out is thrown away (the probe's) still tells.
HOSTILE_WIDTH = 17
HOSTILE_TEXT = f"""
import socket
open("/out/text-block-ran", "w").write("ran")
try:
    socket.create_connection(("127.0.0.1", 9), timeout=2)
    outcome = "connected"
except OSError as error:
    outcome = type(error).__name__
open("/out/text-block-connected", "w").write(outcome)
import bpy
for scene in bpy.data.scenes:
    scene.render.resolution_x = {HOSTILE_WIDTH}
"""
HOSTILE_SCENE = f"""
import bpy
scene = bpy.context.scene
scene.render.engine = "CYCLES"
scene.cycles.samples = 1
scene.cycles.use_denoising = False
scene.render.resolution_x, scene.render.resolution_y, scene.render.resolution_percentage = 32, 24, 100
scene.frame_start, scene.frame_end = 1, 2
text = bpy.data.texts.new("autorun.py")
text.write({HOSTILE_TEXT!r})
text.use_module = True
curve = bpy.data.objects["Cube"].driver_add("location", 0)
curve.driver.type = "SCRIPTED"
curve.driver.expression = "open('/out/driver-ran', 'w').write('ran') * 0"
bpy.ops.wm.save_as_mainfile(filepath="/out/hostile.blend")
"""
MARKERS = ("text-block-ran", "text-block-connected", "driver-ran")


def blender_in_image(folder: Path, script: str) -> None:
    command = [DOCKER, "run", "--rm", "--network", "none", "--user", "root", "-v", f"{folder}:/out", RENDER_IMAGE]
    command += ["blender", "-b", "--factory-startup", "--python-expr", script]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


@pytest.fixture(scope="session")
def render_image(docker_engine: str) -> str:
    subprocess.run([str(ROOT / "compose/bin/build-render-image")], check=True, timeout=1500)
    return RENDER_IMAGE


@contextlib.contextmanager
def own_folder(name: str) -> Iterator[Path]:
    """A folder of this run's own, outside pytest's temporary folders: another pytest run on the machine
    prunes those (it keeps the last three) while this run's render worker may still write into them."""
    folder = Path(tempfile.mkdtemp(prefix=f"gpu-portal-{name}-{RUN_ID}-", dir="/var/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# Each module that imports these fixtures gets a definition of its own, so a session fixture would run
# once per module: the scenes, the render folder and the worker are made once per run and kept here.
SHARED: dict[str, Any] = {}


@contextlib.contextmanager
def once(key: str, make: Callable[[], contextlib.AbstractContextManager[Any]]) -> Iterator[Any]:
    """The run's one value for ``key``: made by the first fixture that asks, ended with that fixture."""
    if key in SHARED:
        yield SHARED[key]
        return
    with make() as value:
        SHARED[key] = value
        try:
            yield value
        finally:
            del SHARED[key]


@contextlib.contextmanager
def scene_folder() -> Iterator[Path]:
    with own_folder("render-scenes") as folder:
        for script in (SMALL_SCENE, SLOW_SCENE, NO_CAMERA_SCENE, HOSTILE_SCENE, BIG_SCENE, WIDE_SCENE, ENDLESS_SCENE):
            blender_in_image(folder, script)
        (folder / "unreadable.blend").write_bytes(b"BLENDER-v304" + secrets.token_bytes(4096))
        yield folder


@pytest.fixture(scope="session")
def scenes(render_image: str) -> Iterator[Path]:
    with once("scenes", scene_folder) as folder:
        yield folder


@pytest.fixture(scope="session")
def render_root() -> Path:
    """The run's render folder, which every process of the run uses (tests/conftest.py)."""
    return RENDER_ROOT


def start_worker(role: str, queue: str, threads: int, render_root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A Celery worker of the render side on its queue, threads as the supervisor runs it."""
    name = f"{role}-{RUN_ID}@127.0.0.1"
    env = processes.child_env(
        PORTAL_RENDER_DIR=str(render_root),
        PORTAL_RENDER_CHUNK_ATTEMPTS=str(CHUNK_ATTEMPTS),
        PORTAL_RENDER_CHUNK_WALL_SECONDS="600",
    )
    command = [str(BIN / "celery"), "--app", "portal", "worker", "--pool", "threads", "--concurrency", str(threads)]
    command += ["--queues", queue, "--hostname", name, "--without-gossip", "--without-mingle"]
    log = (ARTIFACTS / "logs" / f"{role}-worker.log").open("ab")
    process = subprocess.Popen(
        [*command, "--loglevel", "INFO"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    processes.ready_or_stopped(
        process, lambda: bool(app.control.ping(destination=[name], timeout=0.5)), 60, f"{role} worker"
    )
    return process, name


def start_render_worker(render_root: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_worker("render", render_queue(), RENDER_THREADS, render_root)


@pytest.fixture(scope="session")
def render_worker(celery_worker: str, render_image: str, render_root: Path) -> Iterator[str]:
    """A Celery worker on the render queue and one on the estimate queue (the probe's own lane), beside the
    session's worker on the default queue (dispatch, billing's end-of-holding charge); the render one's name."""
    with once("render_worker", lambda: running_workers(render_root)) as name:
        yield name


@contextlib.contextmanager
def running_workers(render_root: Path) -> Iterator[str]:
    SHARED["render_process"], name = start_render_worker(render_root)
    try:
        SHARED["estimate_process"], SHARED["estimate_worker"] = start_worker(
            "estimate", estimate_queue(), ESTIMATE_THREADS, render_root
        )
        yield name
    finally:
        for role in ("estimate", "render"):
            if f"{role}_process" in SHARED:
                processes.stop(SHARED.pop(f"{role}_process"))


def estimate_worker() -> str:
    """The name of the estimate queue's worker (started with ``render_worker``)."""
    return str(SHARED["estimate_worker"])


def kill_and_restart_render_worker(render_root: Path) -> None:
    """SIGKILL the render worker (its threads die mid-chunk; Docker's containers run on), then start it again
    under the same name, as the supervisor would."""
    killed = SHARED["render_process"]
    killed.kill()
    killed.wait(timeout=30)
    SHARED["render_process"], _ = start_render_worker(render_root)


@pytest.fixture
def render_stack(render_worker: str, render_root: Path, settings, transactional_db: None) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """The render folder the worker uses, and the simulated fleet every process here knows (the default)."""
    settings.RENDER_DIR = render_root
    use_fleet(settings, settings.SIMULATED_FLEET)
    from billing import seeds
    from billing.models import Price

    seeds.ensure(Price)  # a transactional test starts from an empty table
    yield render_root
    # The test's rows are flushed next: let the worker finish with them first (a slice's worker releases
    # its slice just after the job's last push).
    wait_for(lambda: not running_tasks(render_worker), 60, "the render worker idle")
    wait_for(lambda: not running_tasks(estimate_worker()), 60, "the estimate worker idle")
    get_backend.cache_clear()


def running_tasks(worker: str) -> list[object]:
    """The tasks a worker is running now; empty when it is idle."""
    found = app.control.inspect(destination=[worker], timeout=1).active() or {}
    return list(found.get(worker, []))


def make_job(owner: User, scene: Path, frames: list[int], state: str, **fields: object) -> RenderJob:
    """A job whose upload was checked, at ``state``, its scene copied in as its main file."""
    folder = f"t{owner.pk}/{secrets.token_hex(8)}"
    job = RenderJob(
        owner=owner,
        state=state,
        upload_name=scene.name,
        folder=folder,
        main_file="scene.blend",
        frame_spec=",".join(str(n) for n in frames),
        frames=frames,
        frame_count=len(frames),
        **{"resolution_percent": 100, "chunk_size": 2, "max_slices": 1, **MIG_OFFER, **fields},  # type: ignore[arg-type]
    )
    job.scene_path().mkdir(parents=True)
    shutil.copy(scene, job.scene_path() / "scene.blend")
    job.scene_sha256 = filestore.scene_checksum(job.scene_path())[0]  # as unpacking records it
    job.save(force_insert=True)
    return job


def with_estimate(job: RenderJob, width: int, height: int) -> None:
    """The estimate a probe of a ``width`` x ``height`` scene (at 100 %) would have written for the job: what a
    job made straight at ``queued`` lacks, and its chunks read the size of its frames from."""
    facts = SceneFacts("Scene", 1, 1, 3, 1, 24.0, width, height, 100, "CYCLES", True, 4, "PNG", (3, 4, 1))
    found = services.Estimate(
        facts={**dataclasses.asdict(facts), "version": list(facts.version)},
        device="CPU",
        probe_samples=4,
        seconds_per_frame=1.0,
        overhead_s=1.0,
        frames=job.frame_count,
        chunks=1,
        slices=1,
        total_seconds=1.0,
        cost="",
    )
    (job.folder_path() / services.ESTIMATE_FILE).write_text(json.dumps(dataclasses.asdict(found)))


def queued_as_one_chunk(owner: User, scene: Path, frames: list[int], size: tuple[int, int]) -> tuple[RenderJob, Slice]:
    """A job queued as one chunk of ``frames``, estimated at ``size``, holding a slice for its worker (which a
    test then runs itself: ``chunks.work_on_slice``)."""
    job = make_job(owner, scene, frames, RenderJob.State.QUEUED, chunk_size=len(frames))
    with_estimate(job, *size)
    RenderFrame.objects.bulk_create([RenderFrame(job=job, number=n) for n in frames])
    RenderChunk.objects.create(job=job, index=0, frames=frames)
    return job, allocate(owner, SliceRequest("mig", "1g.18gb", "H200"), holder=Holder.render(job.pk))


def wait_for(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def state_of(job: RenderJob) -> str:
    return RenderJob.objects.get(pk=job.pk).state


def slices_of(job: RenderJob) -> list[Slice]:
    return list(Slice.objects.filter(holder_kind=HolderKind.RENDER, holder_id=job.pk).order_by("pk"))


def containers_of(job: RenderJob) -> list[str]:
    """This portal's containers of the job, running or not (a parallel test run's job of the same id is not ours)."""
    label = f"label=gpu-portal.render_job={job.pk}"
    ours = f"label={INSTANCE_LABEL}={settings.INSTANCE_ID}"
    found = subprocess.run(
        [DOCKER, "ps", "-aq", "--filter", label, "--filter", ours], capture_output=True, text=True, check=True
    )
    return found.stdout.split()


def charged_by_the_meter(held: Slice) -> None:
    """The holding's end sent billing's task to the default queue's worker, whose meter charged each started
    minute of it once, in balanced ledger transactions taken from its owner's wallet."""
    wait_for(lambda: Usage.objects.filter(slice=held, open=False).exists(), 60, "the meter's charge of the holding")
    usage = Usage.objects.get(slice=held)
    assert held.held_from is not None and held.held_until is not None
    minutes = math.ceil((held.held_until - held.held_from).total_seconds() / 60)
    charged = ChargedMinute.objects.filter(usage=usage)
    assert sorted(charged.values_list("minute", flat=True)) == list(range(max(1, minutes)))
    assert usage.billed_minutes == charged.count() and usage.ended == held.held_until
    posted = LedgerTransaction.objects.filter(pk__in=charged.values("transaction"))
    assert posted.exists() and all(txn.kind == "usage" and txn.user_id == held.owner_id for txn in posted)
    entries = Entry.objects.filter(transaction__in=posted)
    assert entries.aggregate(total=Sum("amount"))["total"] == 0, "every transaction balances"
    taken = -(entries.filter(account__kind=Account.Kind.WALLET).aggregate(total=Sum("amount"))["total"] or 0)
    assert taken == usage.per_minute * charged.count() > 0, "the wallet paid each minute at the frozen rate"


def settings_queue() -> str:
    return str(settings.CELERY_TASK_DEFAULT_QUEUE)


@contextlib.contextmanager
def daphne_on(render_root: Path, **extra: str) -> Iterator[str]:
    """The portal under daphne with this render folder; ``extra`` adds to its environment."""
    port = processes.free_port()
    log = ARTIFACTS / "logs" / "daphne-render.log"
    process = processes.start_daphne(port, log, PORTAL_RENDER_DIR=str(render_root), **extra)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        processes.stop(process)


@pytest.fixture(scope="session")
def render_portal_server(django_db_setup: None, render_root: Path) -> Iterator[str]:
    """The portal under daphne with the render worker's render folder: what a browser uploads there is the
    scene the worker renders, and the thumbnails the worker writes are the ones the pages send. (Every process
    of the run has that folder now, the session's ``portal_server`` too; this one is kept for its own log.)"""
    with once("render_portal_server", lambda: daphne_on(render_root)) as url:
        yield url
