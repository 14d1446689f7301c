"""Blender in the render sandbox, on the real Docker engine with the render image (compose/bin/build-render-image).

Scenes are made by Blender itself in the image; the slice is a MIG slice of a simulated H200, whose device
request reaches the container through the stand-in NVIDIA hook (Cycles renders on the CPU).
"""

from __future__ import annotations

import json
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.holders import Holder
from sessions.gpus.models import Slice
from sessions.runtime.blender import RENDER_UID, RenderSettings, cycles_gpu, preview_file
from sessions.runtime.blender_log import Event, FrameSaved, Progress
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.render import (
    PURPOSE_LABEL,
    RENDER_IMAGE,
    Scene,
    SceneUnreadable,
    probe,
    read_scene,
    render,
    run_sandboxed,
)
from sessions.runtime.slices import spec_for
from sessions.runtime.spec import ContainerSpec
from sessions.runtime.watchdogs import folder_bytes
from tests.gpus.conftest import use_fleet
from tests.helpers.processes import ROOT
from tests.render.stack import HOSTILE_SCENE, HOSTILE_WIDTH, MARKERS

pytestmark = [pytest.mark.docker, pytest.mark.django_db]

DOCKER = "/usr/bin/docker"

# A small scene: the factory cube turning over three frames, 64x48, Cycles at 4 samples. Its denoising is
# left on, as Blender's default has it: Debian's build cannot denoise, so the runner must turn it off.
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
bpy.ops.wm.save_as_mainfile(filepath="/out/scene.blend")
"""

# A render that takes hours: a million samples, every one of them taken (no adaptive sampling).
SLOW_SCENE = SMALL_SCENE.replace(
    "samples = 4", "samples = 1 << 20\nscene.cycles.use_adaptive_sampling = False"
).replace("scene.blend", "slow.blend")


def blender_in_image(folder: Path, *args: str, scene: Path | None = None) -> str:
    """Blender in the render image, trusted and outside our sandbox: for making test files."""
    mounts = ["-v", f"{folder}:/out"] + (["-v", f"{scene}:/scene:ro"] if scene else [])
    command = [DOCKER, "run", "--rm", "--network", "none", "--user", "root", *mounts, RENDER_IMAGE, "blender", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def render_image(docker_engine: str) -> str:
    subprocess.run([str(ROOT / "compose/bin/build-render-image")], check=True, timeout=1200)
    return RENDER_IMAGE


@pytest.fixture(scope="module")
def scenes(render_image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scenes")
    blender_in_image(folder, "-b", "--factory-startup", "--python-expr", SMALL_SCENE)
    blender_in_image(folder, "-b", "--factory-startup", "--python-expr", HOSTILE_SCENE)
    blender_in_image(folder, "-b", "--factory-startup", "--python-expr", SLOW_SCENE)
    return folder


@pytest.fixture
def mig_slice(settings, alice: User) -> Iterator[Slice]:  # type: ignore[no-untyped-def]
    use_fleet(settings, "render: 1xH200:mig")
    yield allocate(alice, SliceRequest("mig", "1g.18gb"), holder=Holder.render(7))
    get_backend.cache_clear()


@pytest.fixture
def spec(mig_slice: Slice, render_image: str) -> ContainerSpec:
    return spec_for(mig_slice, render_image, labels={"gpu-portal.render-job": "7"})


@pytest.fixture
def output(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_three_frames_render_with_progress_saved_lines_and_pngs_on_the_slice(
    scenes: Path, spec: ContainerSpec, mig_slice: Slice, output: Path
) -> None:
    runtime = DockerRuntime()
    seen: list[tuple[float, Event]] = []
    first_saved: list[tuple[int, bool]] = []
    inspected: list[dict[str, Any]] = []

    def on_line(line: str, event: Event | None) -> None:
        if event is not None:
            seen.append((time.monotonic(), event))
        if isinstance(event, FrameSaved) and not first_saved:
            running = runtime.client.containers.get(inspected[0]["Id"]).attrs["State"]["Running"]
            first_saved.append((len(list(output.glob("*.png"))), running))

    def on_start(container_id: str) -> None:
        inspected.append(runtime.client.containers.get(container_id).attrs)

    result = render(
        runtime,
        spec,
        Scene(scenes, "scene.blend"),
        output,
        (1, 2, 3),
        RenderSettings(),
        wall_time_s=300,
        on_line=on_line,
        on_start=on_start,
    )
    assert result.ok, f"{result.failure}\n{result.log.excerpt()}"
    assert result.device == "CPU"
    saved = [event for _, event in seen if isinstance(event, FrameSaved)]
    assert [event.frame for event in saved] == [1, 2, 3]
    assert [event.path for event in saved] == [f"/out/frame_00000{n}.png" for n in (1, 2, 3)]
    samples = {(event.frame, event.sample, event.samples) for _, event in seen if isinstance(event, Progress)}
    assert {(frame, 4, 4) for frame in (1, 2, 3)} <= samples
    assert sorted(path.name for path in output.iterdir()) == [f"frame_00000{n}.png" for n in (1, 2, 3)]
    assert all(png_size(path) == (64, 48) for path in result.saved.values())
    assert all(result.log.timings[frame].total is not None for frame in (1, 2, 3))
    # Lines came as Blender printed them: the first frame was on disk, alone, while the container still ran.
    assert first_saved == [(1, True)]

    host = inspected[0]["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges:true"]
    limits = runtime.within_host(spec).limits
    assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (
        int(limits.cpus * 1e9),
        limits.memory_bytes,
        limits.pids,
    )
    assert host["DeviceRequests"][0]["DeviceIDs"] == [mig_slice.device_uuid]
    assert inspected[0]["Config"]["User"] == f"{RENDER_UID}:{RENDER_UID}"
    mounts = {mount["Destination"]: mount["RW"] for mount in inspected[0]["Mounts"]}
    assert mounts == {"/scene": False, "/out": True}
    assert inspected[0]["Config"]["Labels"][PURPOSE_LABEL] == "frames"
    assert runtime.containers_for("render") == []


def test_openexr_frames_render_where_the_build_writes_it_each_with_a_small_png_for_its_thumbnail(
    scenes: Path, spec: ContainerSpec, output: Path
) -> None:
    settings = RenderSettings(file_format="OPEN_EXR", preview_pixels=32)
    result = render(DockerRuntime(), spec, Scene(scenes, "scene.blend"), output, (1, 2), settings, wall_time_s=300)

    assert result.ok, f"{result.failure}\n{result.log.excerpt()}"
    assert result.formats == ("PNG", "OPEN_EXR"), "Debian's Blender writes OpenEXR"
    assert sorted(path.name for path in result.saved.values()) == ["frame_000001.exr", "frame_000002.exr"]
    assert all(path.read_bytes()[:4] == b"\x76\x2f\x31\x01" for path in result.saved.values()), "OpenEXR's magic"
    for frame in (1, 2):
        assert result.said_preview(frame)
        assert png_size(output / preview_file(frame)) == (32, 24), "scaled to 32 px on its longest side"
    assert sorted(path.name for path in output.iterdir()) == [
        "frame_000001.exr",
        "frame_000002.exr",
        "preview_000001.png",
        "preview_000002.png",
    ]


SANDBOX_CHECK = r"""
import errno, json, os
def write(path):
    try:
        open(path, "w").write("x")
        return "written"
    except OSError as error:
        return errno.errorcode[error.errno]
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "routes": open("/proc/net/route").read().splitlines()[1:],
    "scene": write("/scene/scene.blend"), "scene_new": write("/scene/new"), "root": write("/etc/new"),
    "out": write("/out/new"), "tmp": write("/tmp/new"),
    "capabilities": status["CapEff"].strip(),
    "device": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
}))
"""


def test_the_sandbox_has_no_network_and_writes_only_its_output_as_a_non_root_user(
    scenes: Path, spec: ContainerSpec, mig_slice: Slice, output: Path
) -> None:
    lines: list[str] = []
    ended = run_sandboxed(
        DockerRuntime(),
        spec,
        ["python3", "-c", SANDBOX_CHECK],
        scene_folder=scenes,
        output=output,
        wall_time_s=60,
        purpose="check",
        on_line=lines.append,
    )
    assert ended.exit_code == 0, lines
    seen = json.loads(lines[-1])
    assert (seen["uid"], seen["gid"]) == (RENDER_UID, RENDER_UID)
    assert seen["interfaces"] == ["lo"] and seen["routes"] == []
    assert seen["scene"] == seen["scene_new"] == seen["root"] == "EROFS"
    assert seen["out"] == seen["tmp"] == "written"
    assert seen["capabilities"] == "0000000000000000"
    assert seen["device"] == mig_slice.device_uuid
    assert (output / "new").read_text() == "x"


def test_the_wall_time_limit_kills_and_removes_a_long_render(scenes: Path, spec: ContainerSpec, output: Path) -> None:
    runtime = DockerRuntime()
    result = render(runtime, spec, Scene(scenes, "slow.blend"), output, (1,), RenderSettings(), wall_time_s=4)
    assert result.exit.timed_out and not result.ok  # the wall-time watchdog stopped it, nothing else
    assert result.failure == "stopped: it ran past its wall-time limit of 4 s"
    assert result.log.current is not None and result.log.current.sample  # killed while it sampled
    assert result.saved == {} and list(output.iterdir()) == []
    assert runtime.containers_for("render") == []


# What a hostile run could do to /out, a host folder: fill it with one growing file, or with empty files
# (inodes fill a disk too). Each loops for ever; only the output watchdog stops it.
FILLERS = {
    "one growing file": "while :; do head -c 65536 /dev/zero >> /out/junk; done",
    "many empty files": "i=0; while :; do : > /out/f$i; i=$((i+1)); done",
}


@pytest.mark.parametrize("filler", FILLERS.values(), ids=FILLERS.keys())
def test_a_run_writing_past_its_output_limit_is_stopped_at_once_and_says_so(
    scenes: Path, spec: ContainerSpec, output: Path, filler: str
) -> None:
    runtime = DockerRuntime()
    ended = run_sandboxed(
        runtime,
        spec,
        ["sh", "-c", filler],
        scene_folder=scenes,
        output=output,
        wall_time_s=120,
        purpose="check",
        output_limit=1 << 20,
    )
    assert not ended.timed_out  # stopped by the output watchdog, long before its 120 s wall time
    assert ended.output_exceeded and ended.exit_code != 0
    assert ended.failure(120, spec.limits.memory_bytes) == (
        "stopped: it wrote more than 1 MiB into its output folder, its limit"
    )
    # Past the limit by what it wrote between two counts and the kill: a shell makes tens of thousands of empty
    # files a second (each counted at 4 KiB), so on a busy machine that is tens of MiB; at the wall time it
    # would be gigabytes.
    written = folder_bytes(output)
    assert 1 << 20 < written < 256 << 20, f"stopped soon after the limit, not at the wall time ({written} bytes)"
    assert runtime.containers_for("render") == []


def test_a_run_within_its_output_limit_is_not_stopped(scenes: Path, spec: ContainerSpec, output: Path) -> None:
    ended = run_sandboxed(
        DockerRuntime(),
        spec,
        ["sh", "-c", "head -c 100000 /dev/zero > /out/frame; sleep 1"],
        scene_folder=scenes,
        output=output,
        wall_time_s=60,
        purpose="check",
        output_limit=1 << 20,
    )
    assert ended.exit_code == 0 and not ended.output_exceeded
    assert ended.failure(60, spec.limits.memory_bytes) is None


def test_the_output_count_follows_no_link_and_counts_a_sparse_file_at_its_length(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * (1 << 20))
    output = tmp_path / "out"
    output.mkdir()
    (output / "link").symlink_to(outside)
    assert folder_bytes(output) == 4096, "the link is one entry; what it points to is not counted"
    with (output / "sparse").open("wb") as sparse:
        sparse.truncate(1 << 30)
    assert folder_bytes(output) == 4096 + (1 << 30)
    assert folder_bytes(output, stop_above=1000) > 1000


def test_a_run_whose_reader_gives_up_leaves_no_container_behind(
    scenes: Path, spec: ContainerSpec, output: Path
) -> None:
    runtime = DockerRuntime()

    def give_up(line: str, event: Event | None) -> None:
        if isinstance(event, Progress):
            assert runtime.containers_for("render") != []
            raise KeyboardInterrupt  # a worker stopped mid-render

    with pytest.raises(KeyboardInterrupt):
        render(
            runtime, spec, Scene(scenes, "slow.blend"), output, (1,), RenderSettings(), wall_time_s=60, on_line=give_up
        )
    assert runtime.containers_for("render") == []


def test_on_a_real_gpus_slice_cycles_tries_optix_then_cuda_and_says_why_it_rendered_on_the_cpu(
    scenes: Path, spec: ContainerSpec, output: Path
) -> None:
    settings = RenderSettings(gpu=cycles_gpu(simulated=False))
    result = render(DockerRuntime(), spec, Scene(scenes, "scene.blend"), output, (2,), settings, wall_time_s=120)
    assert result.ok and list(result.saved) == [2]
    # Debian's build has CUDA and HIP but no OptiX; this machine has no NVIDIA device for CUDA to find.
    assert result.device == "CPU"
    assert result.device_notes == ["OPTIX: not in this Blender build", "CUDA: no device"]


def test_the_scene_facts_are_read_by_blender_in_the_sandbox(scenes: Path, spec: ContainerSpec) -> None:
    facts = read_scene(DockerRuntime(), spec, Scene(scenes, "scene.blend"))
    assert (facts.frame_start, facts.frame_end, facts.frame_step) == (1, 3, 1)
    assert (facts.resolution_x, facts.resolution_y, facts.resolution_percentage) == (64, 48, 100)
    assert facts.engine == "CYCLES" and facts.camera is True and facts.samples == 4
    assert facts.version[0] == 3 and facts.scene == "Scene"


def test_a_probe_renders_the_frames_it_is_given_as_the_job_would_and_times_them(
    scenes: Path, spec: ContainerSpec, output: Path
) -> None:
    found = probe(DockerRuntime(), spec, Scene(scenes, "scene.blend"), output, RenderSettings(), frames=(1, 3))
    assert found.frames == (1, 3) and found.result.device == "CPU" and found.limit_s is None
    assert sorted(found.result.saved) == [1, 3] and png_size(found.result.saved[3]) == (64, 48)
    assert [timing.samples for timing in found.timings] == [4, 4], "at the scene's own samples"
    totals = [timing.total or 0.0 for timing in found.timings]
    assert found.seconds_per_frame == pytest.approx(max(0.01, sum(totals) / 2), abs=0.011)
    assert 0 < found.overhead_s == pytest.approx(found.result.exit.wall_s - sum(totals), abs=0.002)
    assert 0 < found.sampling_per_frame <= found.seconds_per_frame, "part of each frame is sampling"
    assert found.stopped == () and found.facts.frame_end == 3


def test_a_probe_stops_each_frames_sampling_at_its_limit_and_projects_the_rest(
    scenes: Path, spec: ContainerSpec, output: Path
) -> None:
    endless = RenderSettings(samples=1 << 20)  # hours of sampling (slow.blend samples without adaptive stops)
    found = probe(DockerRuntime(), spec, Scene(scenes, "slow.blend"), output, endless, frames=(2,), limit_s=1.0)
    assert found.limit_s == 1.0 and found.stopped == (2,)
    [timing] = found.timings
    assert timing.reached is not None and 0 < timing.reached < 1 << 20 and timing.samples == 1 << 20
    assert found.result.exit.wall_s < 30, "stopped after a second of sampling"
    assert found.seconds_per_frame > 100 * found.result.exit.wall_s, "the samples left, projected"


@pytest.mark.parametrize(
    ("contents", "words"),
    [
        (lambda scenes: b"\x89PNG\r\n\x1a\n" + b"\0" * 200, "Error: File format is not supported"),
        (lambda scenes: b"", "Error: File format is not supported"),
        (lambda scenes: (scenes / "scene.blend").read_bytes()[:3000], "Error: Failed to read blend file"),
    ],
    ids=["an-image", "empty", "truncated"],
)
def test_a_file_that_is_no_readable_blend_is_refused_with_blenders_own_words(
    scenes: Path, tmp_path: Path, spec: ContainerSpec, contents: Callable[[Path], bytes], words: str
) -> None:
    (tmp_path / "scene.blend").write_bytes(contents(scenes))
    with pytest.raises(SceneUnreadable) as refused:
        read_scene(DockerRuntime(), spec, Scene(tmp_path, "scene.blend"))
    assert str(refused.value).startswith(f"Blender could not read scene.blend: {words}")
    assert words in refused.value.excerpt
    assert DockerRuntime().containers_for("render") == []


def test_a_scenes_text_block_and_scripted_driver_never_run_in_the_sandbox(
    scenes: Path, spec: ContainerSpec, tmp_path: Path
) -> None:
    # Proof that they would run: Blender with scripts allowed (-y) writes every marker, tried to connect, and
    # rendered the frame as wide as the text block said.
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    blender_in_image(allowed, "-b", "-y", "/scene/hostile.blend", "-o", "/out/f_#", "-f", "1", scene=scenes)
    assert sorted(path.name for path in allowed.iterdir() if not path.name.startswith("f_")) == sorted(MARKERS)
    assert (allowed / "text-block-connected").read_text() == "ConnectionRefusedError"
    [allowed_frame] = allowed.glob("f_*.png")
    assert png_size(allowed_frame) == (HOSTILE_WIDTH, 24)

    runtime, scene = DockerRuntime(), Scene(scenes, "hostile.blend")
    facts = read_scene(runtime, spec, scene)
    probed_in, rendered_in = tmp_path / "probe", tmp_path / "render"
    probed_in.mkdir()
    rendered_in.mkdir()
    probed = probe(runtime, spec, scene, probed_in, RenderSettings())
    rendered = render(runtime, spec, scene, rendered_in, (1, 2), RenderSettings(), wall_time_s=120)
    assert facts.resolution_x == probed.facts.resolution_x == 32 and probed.result.ok and rendered.ok
    assert sorted(path.name for path in probed_in.iterdir()) == ["frame_000001.png"]
    assert sorted(path.name for path in rendered_in.iterdir()) == ["frame_000001.png", "frame_000002.png"]
    assert {png_size(path) for path in [*probed_in.iterdir(), *rendered_in.iterdir()]} == {(32, 24)}
    # Blender saw both and said it skipped them; no container of the runs is left.
    assert "autorun.py" in rendered.log.skipped_scripts
    assert any("driver-ran" in name for name in rendered.log.skipped_scripts)
    assert runtime.containers_for("render") == []
