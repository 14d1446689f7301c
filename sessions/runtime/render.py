"""Blender in the render sandbox: the container that reads, probes or renders an uploaded scene.

The sandbox is the slice's container spec (its GPU device request, CPU/memory/process limits, no network,
no capabilities, no privilege gain) plus: a read-only root, the scene folder mounted read-only at /scene,
one output folder at /out the only writable place (and a small tmpfs /tmp), the image's own unprivileged
user whoever runs the portal, a wall-time limit past which the container is killed, and a bound on what
its output folder may hold (a watchdog counts it a few times a second and kills the container past it:
/out is a host folder, and a hostile scene must not fill the host's disk). Every container is removed when
its run ends. Blender runs with the file's scripts disabled and factory settings
(``sessions.runtime.blender``)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from sessions.runtime import blender
from sessions.runtime.blender import RENDER_UID, RenderSettings
from sessions.runtime.blender_log import CLOCK, MOST_KEPT, BlenderLog, Event, FrameTiming
from sessions.runtime.docker import DockerRuntime, RuntimeError_
from sessions.runtime.sandbox import Sandbox
from sessions.runtime.scene_facts import SceneFacts
from sessions.runtime.spec import LABEL_PREFIX, ContainerSpec
from sessions.runtime.watchdogs import Watchdogs, size_words

log = logging.getLogger(__name__)
RENDER_IMAGE = "gpu-portal/render:latest"  # built by compose/bin/build-render-image
TMP = "/tmp"  # noqa: S108 (the container's own: a small tmpfs, gone with it)
TMP_SIZE = "512m"
PURPOSE_LABEL = f"{LABEL_PREFIX}.render"  # what a render container does: facts, probe, frames

OnLine = Callable[[str, Event | None], None]
OnStart = Callable[[str], None]


class SceneUnreadable(Exception):
    """Blender could not read the scene (or render the probe's frame); ``excerpt`` is its own explanation,
    ``formats`` the output formats its build said it writes (None if it did not get that far)."""

    def __init__(self, message: str, excerpt: str, formats: tuple[str, ...] | None = None) -> None:
        super().__init__(message)
        self.excerpt = excerpt
        self.formats = formats


class SceneTooLarge(SceneUnreadable):
    """The scene's frames would be wider or taller than the render may make them (``RenderSettings.max_side``):
    nothing was rendered."""

    def __init__(self, scene: str, size: tuple[int, int], percentage: int, max_side: int) -> None:
        width, height = size
        super().__init__(
            f"{scene} would render frames of {width} × {height} pixels (its resolution at {percentage} %)", ""
        )
        self.size, self.max_side = size, max_side


@dataclass(frozen=True)
class Scene:
    """An uploaded scene on this host: its folder and the main .blend inside it."""

    folder: Path
    blend: str
    shown_as: str = ""  # how its owner knows it (the uploaded file's name), for messages; empty: ``blend``

    def __post_init__(self) -> None:
        blender.scene_path(self.blend)  # refuses absolute paths and ..
        if not (self.folder / self.blend).is_file():
            raise FileNotFoundError(f"no {self.blend} in {self.folder}")

    @property
    def name(self) -> str:
        return self.shown_as or self.blend

    @property
    def inside(self) -> str:
        """The .blend's path in the sandbox."""
        return blender.scene_path(self.blend)


def container_user() -> str:
    """Who Blender runs as: the image's `render` user, whoever runs the portal (never root, and never the
    portal's own user: nothing the sandbox writes is the portal's)."""
    return f"{RENDER_UID}:{RENDER_UID}"


def hand_over(scene_folder: Path, output: Path | None) -> None:
    """Let the sandbox's user read the scene, never write it, and write the output folder. As root, the
    scene's files join the `render` group and the output folder is the `render` user's. A portal that is not
    root cannot give its files away: the scene becomes readable by others and the output folder writable by
    others, which reaches the sandbox alone: both lie in the job's folder, the portal's user's alone (0700),
    and the sandbox reaches them through its mounts, whatever the folders above them allow."""
    root = os.geteuid() == 0
    if output is not None:
        if root:
            os.chown(output, RENDER_UID, RENDER_UID)
        output.chmod(0o700 if root else 0o777)
    readable, searchable = (0o040, 0o010) if root else (0o004, 0o001)
    for folder, _, files in os.walk(scene_folder):
        for path in [Path(folder), *(Path(folder) / name for name in files)]:
            if path.is_symlink():
                continue
            mode = path.stat().st_mode
            if root:
                os.chown(path, -1, RENDER_UID, follow_symlinks=False)
            path.chmod((mode | readable | (searchable if path.is_dir() else 0)) & ~0o022)


def give_back(runtime: Sandbox, image: str, output: Path | None) -> None:
    """After a run, as a portal that is not root: what the sandbox wrote is its user's, and a folder it made
    the portal could neither empty nor remove. Where it made one (Blender makes none), a short container of
    that same user, with no network and nothing but the output folder mounted, opens the output folder's
    contents up to others (inside the job's private folder, that is the portal)."""
    if output is None or os.geteuid() == 0 or not runtime.files_here:
        return
    with os.scandir(output) as entries:
        if not any(entry.is_dir(follow_symlinks=False) for entry in entries):
            return
    volumes = {str(output.resolve()): {"bind": blender.OUTPUT_DIR, "mode": "rw"}}
    try:
        runtime.run_briefly(image, ["chmod", "-R", "a+rwX", blender.OUTPUT_DIR], container_user(), volumes)
    except RuntimeError_ as error:  # the run's own outcome stands; what cannot be removed later is logged then
        log.warning("could not open up %s after its run: %s", output, error)


def sandbox_options(scene_folder: Path, output: Path | None) -> dict[str, Any]:
    """What the render sandbox adds to a slice's container spec (``DockerRuntime.start`` overrides)."""
    volumes = {str(scene_folder.resolve()): {"bind": blender.SCENE_DIR, "mode": "ro"}}
    if output is not None:
        volumes[str(output.resolve())] = {"bind": blender.OUTPUT_DIR, "mode": "rw"}
    return {
        "volumes": volumes,
        "read_only": True,
        "tmpfs": {TMP: f"rw,noexec,nosuid,nodev,size={TMP_SIZE},mode=1777"},
        "user": container_user(),
        "environment": {"HOME": TMP, "PYTHONDONTWRITEBYTECODE": "1"},
        "working_dir": TMP,
    }


@dataclass(frozen=True)
class Exit:
    """How a sandboxed run ended, as the engine recorded it."""

    exit_code: int | None
    timed_out: bool
    oom_killed: bool
    started_at: datetime | None
    finished_at: datetime | None
    wall_s: float
    output_limit: int | None = None
    output_exceeded: bool = False  # the run was stopped (or found) past ``output_limit``

    def failure(self, wall_time_s: float, memory_bytes: int) -> str | None:
        if self.output_exceeded and self.output_limit is not None:
            return f"stopped: it wrote more than {size_words(self.output_limit)} into its output folder, its limit"
        if self.timed_out:
            return f"stopped: it ran past its wall-time limit of {wall_time_s:g} s"
        if self.oom_killed:
            return f"stopped: it ran out of memory (limit {memory_bytes / 1024**3:.1f} GiB)"
        if self.exit_code:
            return f"Blender exited with status {self.exit_code}"
        return None


def run_sandboxed(
    runtime: Sandbox,
    spec: ContainerSpec,
    command: list[str],
    *,
    scene_folder: Path,
    output: Path | None,
    wall_time_s: float,
    purpose: str,
    on_line: Callable[[str], object] | None = None,
    on_start: OnStart | None = None,
    output_limit: int | None = None,
) -> Exit:
    """Run a command in the sandbox, streaming its lines, killing it past ``wall_time_s`` or once its output
    folder holds more than ``output_limit`` bytes; always removed."""
    if runtime.files_here:  # else the run fetches its scene and gives its output back (the file store)
        hand_over(scene_folder, output)
    overrides = sandbox_options(scene_folder, output)
    began = time.monotonic()
    container_id = runtime.start(spec, command, labels={**spec.labels, PURPOSE_LABEL: purpose}, **overrides)
    watchdogs = Watchdogs(runtime, container_id, output, output_limit)
    watchdogs.start(wall_time_s)
    try:
        if on_start is not None:
            on_start(container_id)
        for line in runtime.output_lines(container_id):
            if on_line is not None:
                on_line(line)
        state = runtime.exit_of(container_id)
    finally:
        watchdogs.stop()
        runtime.remove(container_id)
        give_back(runtime, spec.image, output)
    return Exit(
        state.exit_code,
        watchdogs.timed_out.is_set(),
        state.oom_killed,
        state.started_at,
        state.finished_at,
        round(time.monotonic() - began, 3),
        output_limit,
        watchdogs.over.is_set(),
    )


@dataclass(frozen=True)
class RenderResult:
    """One render run: how it ended, what Blender said, which frames were saved where."""

    exit: Exit
    frames: tuple[int, ...]
    saved: dict[int, Path]
    log: BlenderLog = field(repr=False)
    failure: str | None
    device: str | None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(frame for frame in self.frames if frame not in self.saved)

    @property
    def device_notes(self) -> list[str]:
        """Why each GPU backend tried was passed over (not in the build, no device, no kernels)."""
        return [str(item.value) for item in self.log.marked if item.kind == "note"]

    @property
    def formats(self) -> tuple[str, ...] | None:
        """The portal's output formats this Blender build writes, as it said; None if it did not say."""
        return _writes(self.log)

    def said_preview(self, frame: int) -> bool:
        """Whether Blender said it wrote its small PNG of a saved frame (``RenderSettings.preview_pixels``), as
        ``blender.preview_file(frame)`` in the output folder: the caller opens it as a file the sandbox wrote."""
        return any(item.kind == "preview" and item.value == frame for item in self.log.marked)


def threads_for(spec: ContainerSpec, runtime: Sandbox) -> int:
    """Cycles' threads: the slice's CPUs (left alone, it would start one per host core and be throttled)."""
    return max(1, math.ceil(runtime.within_host(spec).limits.cpus))


def memory_of(spec: ContainerSpec, runtime: Sandbox) -> int:
    """The memory the container is given: its slice's share, cut to what its host can give."""
    return runtime.within_host(spec).limits.memory_bytes


def _saved_frames(log: BlenderLog, output: Path, frames: tuple[int, ...], file_format: str) -> dict[int, Path]:
    """Frames Blender said it saved whose files are in the output folder under the names we asked for."""
    said = {PurePosixPath(item.path).name for item in log.saved if item.path.startswith(f"{blender.OUTPUT_DIR}/")}
    found: dict[int, Path] = {}
    for frame in frames:
        name = blender.frame_file(frame, file_format)
        if name in said and (output / name).is_file():
            found[frame] = output / name
    return found


def _streamed(log: BlenderLog, on_line: OnLine | None) -> Callable[[str], None]:
    def fed(line: str) -> None:
        event = log.feed(line)
        if on_line is not None:
            on_line(line, event)

    return fed


def _device(log: BlenderLog) -> str | None:
    found = log.last("device")
    return found.value if found is not None and isinstance(found.value, str) else None


def _writes(log: BlenderLog) -> tuple[str, ...] | None:
    found = log.last("formats")
    if found is None or not isinstance(found.value, list):
        return None
    return tuple(name for name in found.value if name in blender.FORMATS)


def _failure(ended: Exit, log: BlenderLog, settings: RenderSettings, wall_time_s: float, memory: int) -> str | None:
    """Why the run failed: the build cannot write the format asked for (Blender then saves another), or how
    the container ended."""
    return blender.format_refusal(settings.file_format, _writes(log)) or ended.failure(wall_time_s, memory)


def render(
    runtime: Sandbox,
    spec: ContainerSpec,
    scene: Scene,
    output: Path,
    frames: tuple[int, ...],
    settings: RenderSettings,
    *,
    wall_time_s: float,
    on_line: OnLine | None = None,
    on_start: OnStart | None = None,
    output_limit: int | None = None,
) -> RenderResult:
    """Render frames of a scene into ``output`` on the spec's slice; fails (``failure`` in words, the log's
    excerpt) unless Blender exited cleanly and every frame's file is there."""
    mark = blender.new_mark()
    log = BlenderLog(mark, most_kept=MOST_KEPT + 2 * len(frames))  # each frame's saved and preview lines kept
    command = blender.render_command(scene.blend, frames, settings, mark, threads_for(spec, runtime))
    ended = run_sandboxed(
        runtime,
        spec,
        command,
        scene_folder=scene.folder,
        output=output,
        wall_time_s=wall_time_s,
        purpose="frames",
        on_line=_streamed(log, on_line),
        on_start=on_start,
        output_limit=output_limit,
    )
    saved = _saved_frames(log, output, frames, settings.file_format)
    failure = _failure(ended, log, settings, wall_time_s, memory_of(spec, runtime))
    if failure is None and len(saved) < len(frames):
        failure = _explained(f"{len(frames) - len(saved)} of {len(frames)} frames were not saved", log)
    return RenderResult(ended, frames, saved, log, failure, _device(log))


def _explained(failure: str, log: BlenderLog) -> str:
    """A failure with Blender's first error line, where it printed one."""
    return f"{failure} ({log.errors[0]})" if log.errors else failure


def _facts(log: BlenderLog, scene: Scene, ended: Exit, wall_time_s: float, memory: int) -> SceneFacts:
    try:
        return SceneFacts.from_json(log.only("facts").value, scene.inside)
    except ValueError as error:  # SceneFactsError among them
        stopped = ended.timed_out or ended.oom_killed or ended.output_exceeded
        reason = ended.failure(wall_time_s, memory) if stopped else None
        reason = reason or (log.errors[0] if log.errors else str(error))
        raise SceneUnreadable(f"Blender could not read {scene.name}: {reason}", log.excerpt()) from None


def read_scene(runtime: DockerRuntime, spec: ContainerSpec, scene: Scene, *, wall_time_s: float = 120) -> SceneFacts:
    """The scene's facts, read by Blender in the sandbox; SceneUnreadable with Blender's own words if not."""
    mark = blender.new_mark()
    log = BlenderLog(mark)
    ended = run_sandboxed(
        runtime,
        spec,
        blender.facts_command(scene.blend, mark),
        scene_folder=scene.folder,
        output=None,
        wall_time_s=wall_time_s,
        purpose="facts",
        on_line=log.feed,
    )
    facts = _facts(log, scene, ended, wall_time_s, memory_of(spec, runtime))
    if ended.exit_code:
        raise SceneUnreadable(f"Blender could not read {scene.name}: exit status {ended.exit_code}", log.excerpt())
    return facts


@dataclass(frozen=True)
class Probe:
    """A few of the job's frames rendered as the job renders them (its samples, resolution, format), each
    frame's sampling stopped after ``limit_s`` seconds: the scene's facts, what a frame costs, and what a
    container run costs besides its frames."""

    facts: SceneFacts
    result: RenderResult
    frames: tuple[int, ...]
    timings: tuple[FrameTiming, ...]
    limit_s: float | None  # the probe's bound on each frame's sampling; None where the scene's own, lower, stood
    threads: int  # Cycles' threads in the probe's container (its slice's CPUs)
    host_cpus: int | None  # its host's, where the engine says (a Kubernetes node's is the scheduler's)

    @property
    def frame(self) -> int:
        return self.frames[0]

    @property
    def frame_seconds(self) -> tuple[float, ...]:
        """Each probed frame's time as Blender measured it (scene sync, sampling, saving), or, where the
        probe's limit stopped its sampling, projected to every sample. Without Blender's own figure, the
        whole run's time shared among its frames (it errs high)."""
        projected = [timing.projected(self.limit_s) for timing in self.timings]
        if any(seconds is None for seconds in projected):
            return (self.result.exit.wall_s / len(self.frames),) * len(self.frames)
        return tuple(max(CLOCK, seconds or 0.0) for seconds in projected)

    @property
    def seconds_per_frame(self) -> float:
        """The mean of the probed frames' times."""
        return round(sum(self.frame_seconds) / len(self.frame_seconds), 3)

    @property
    def sampling_per_frame(self) -> float:
        """The part of ``seconds_per_frame`` Cycles spent sampling (spread over all its threads; the rest,
        syncing the scene and saving, runs mostly on one)."""
        sampling = [timing.projected_sampling(self.limit_s) for timing in self.timings]
        if any(seconds is None for seconds in sampling):
            return 0.0
        return round(min(self.seconds_per_frame, sum(s or 0.0 for s in sampling) / len(sampling)), 3)

    @property
    def stopped(self) -> tuple[int, ...]:
        """The frames whose sampling the probe's limit stopped (their time is projected, not measured)."""
        return tuple(timing.frame for timing in self.timings if timing.stopped_by(self.limit_s))

    @property
    def overhead_s(self) -> float:
        """What a container run costs besides its frames, once per chunk: the container's start and end,
        Blender's start, reading the file and the scene's facts, loading the render kernels."""
        if any(timing.total is None for timing in self.timings):
            return 0.0
        measured = sum(timing.total or 0.0 for timing in self.timings)
        return max(0.0, round(self.result.exit.wall_s - measured, 3))


def probe(
    runtime: Sandbox,
    spec: ContainerSpec,
    scene: Scene,
    output: Path,
    settings: RenderSettings,
    *,
    frames: tuple[int, ...] | None = None,
    limit_s: float = 0.0,
    wall_time_s: float = 300,
    output_limit: int | None = None,
) -> Probe:
    """Read the scene and render ``frames`` of it (its first unless told) with the job's settings, each
    frame's sampling stopped after ``limit_s`` seconds (0: never); SceneUnreadable, with Blender's own
    words, if it cannot."""
    mark = blender.new_mark()
    log = BlenderLog(mark)
    threads = threads_for(spec, runtime)
    command = blender.probe_command(scene.blend, settings, mark, threads, frames, limit_s)
    ended = run_sandboxed(
        runtime,
        spec,
        command,
        scene_folder=scene.folder,
        output=output,
        wall_time_s=wall_time_s,
        purpose="probe",
        on_line=log.feed,
        output_limit=output_limit,
    )
    facts = _facts(log, scene, ended, wall_time_s, memory_of(spec, runtime))
    size = facts.size_at(settings.percentage)
    if settings.max_side and max(size) > settings.max_side:
        raise SceneTooLarge(scene.name, size, settings.percentage or facts.resolution_percentage, settings.max_side)
    rendered = frames or (facts.frame_start,)
    saved = _saved_frames(log, output, rendered, settings.file_format)
    failure = _failure(ended, log, settings, wall_time_s, memory_of(spec, runtime))
    if failure is None and len(saved) < len(rendered):
        failure = "the frame was not saved" if len(rendered) == 1 else "not every frame was saved"
    result = RenderResult(ended, rendered, saved, log, failure, _device(log))
    if failure is not None:
        which = ", ".join(str(frame) for frame in rendered)
        words = f"The probe could not render frame{'s' if len(rendered) > 1 else ''} {which} of {scene.name}: "
        raise SceneUnreadable(words + _explained(failure, log), log.excerpt(), result.formats)
    timings = tuple(log.timings.get(frame, FrameTiming(frame)) for frame in rendered)
    said = log.last("time_limit")  # our Python says so only where the probe's limit, not the scene's own, applied
    applied = float(said.value) if said is not None and isinstance(said.value, int | float) else None
    return Probe(facts, result, rendered, timings, applied, threads, runtime.host_cpus())
