"""What we ask Blender, and how: its command lines and the Python it runs for us inside the render sandbox.

Pure (no Django, no Docker). Every run is ``blender -b -Y --factory-startup``: background, the file's own
scripts (registered text blocks, scripted drivers) never run, no user preferences. Our own Python, given on
the command line, prints what it found on lines that start with a mark made afresh for each run, which the
scene cannot know and so cannot forge (``sessions.runtime.blender_log`` reads them).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

BLENDER = "blender"
SAFE_FLAGS = ("-b", "-Y", "--factory-startup")
# Blender's C output to a pipe is block-buffered, flushed at each progress line: line-buffered, an error
# arrives when it is printed and after the lines that led to it, not with the next flush.
LINE_BUFFERED = ("stdbuf", "-oL", "-eL")
RENDER_UID = 10000  # the render image's `render` user (compose/images/render/Dockerfile)
SCENE_DIR = "/scene"  # the uploaded scene, mounted read-only
OUTPUT_DIR = "/out"  # the one writable place
FRAME_NAME = "frame_######"  # Blender writes /out/frame_000001.png
PREVIEW_NAME = "preview_{:06d}.png"  # a frame Pillow cannot read (OpenEXR) also gets this small PNG of it
MAX_FRAME = 1_048_574  # Blender's MAXFRAME
FORMATS = {"PNG": "png", "OPEN_EXR": "exr"}  # Blender's file format -> the extension it writes
FORMAT_NAMES = {"PNG": "PNG", "OPEN_EXR": "OpenEXR"}
PYTHON_FAILED = 3  # Blender's exit status when our Python raises (--python-exit-code)

# Runs inside Blender after the scene is loaded. It reads the options from the argument after "--",
# prints the scene's facts first (before changing anything), then, for a render, sets Cycles up: no
# denoising (Debian's build has no OpenImageDenoise, and a denoising scene fails), our samples and
# resolution (a frame wider or taller than we allow is not rendered at all: it says so and raises, and
# Blender exits, --python-exit-code, before its first frame), and the first GPU backend with a device and
# kernels for it, else the CPU; it says which, and why each backend it passed over was no use. It also says
# which of the portal's output formats this build writes (a build without OpenEXR lacks that item), and,
# where asked (OpenEXR: Pillow cannot read it), has Blender write a small display-ready PNG of each frame
# once the frame is saved, for its thumbnail: the frame is loaded back and scaled as an image of its own, so
# the scene's output settings stay untouched.
IN_BLENDER = r"""
import glob, json, os, shutil, sys
import bpy

KERNELS = {"CUDA": ["kernel_sm_*", "kernel_compute_*"], "OPTIX": ["kernel_optix*"], "HIP": ["kernel_gfx*"]}

options = json.loads(sys.argv[sys.argv.index("--") + 1])
scene = bpy.context.scene

def say(kind, value):
    print(options["mark"], kind, json.dumps(value, separators=(",", ":")), flush=True)

cycles = getattr(scene, "cycles", None)
say("facts", {
    "file": bpy.data.filepath,
    "version": list(bpy.data.version),
    "scene": scene.name,
    "scenes": len(bpy.data.scenes),
    "frame_start": scene.frame_start,
    "frame_end": scene.frame_end,
    "frame_step": scene.frame_step,
    "fps": scene.render.fps / scene.render.fps_base,
    "resolution_x": scene.render.resolution_x,
    "resolution_y": scene.render.resolution_y,
    "resolution_percentage": scene.render.resolution_percentage,
    "engine": scene.render.engine,
    "camera": scene.camera is not None,
    "samples": cycles.samples if cycles is not None else None,
    "file_format": scene.render.image_settings.file_format,
})
writes = {item.identifier for item in bpy.types.ImageFormatSettings.bl_rna.properties["file_format"].enum_items}
say("formats", [name for name in options["formats"] if name in writes])

def preview_scene():
    shown = bpy.data.scenes.new("gpu-portal-preview")
    shown.render.image_settings.file_format = "PNG"
    shown.render.image_settings.color_mode = "RGB"
    for name in ("view_transform", "look", "exposure", "gamma"):
        setattr(shown.view_settings, name, getattr(scene.view_settings, name))
    shown.display_settings.display_device = scene.display_settings.display_device
    return shown

def write_preview(rendered, *args):
    frame = rendered.frame_current
    try:
        image = bpy.data.images.load(rendered.render.frame_path(frame=frame))
    except RuntimeError as error:
        say("no_preview", "frame %d: %s" % (frame, error))
        return
    try:
        width, height = image.size
        scale = min(1.0, options["preview"] / max(1, width, height))
        image.scale(max(1, round(width * scale)), max(1, round(height * scale)))
        image.save_render(os.path.join(OUT, options["preview_name"].format(frame)), scene=PREVIEW)
        say("preview", frame)
    except RuntimeError as error:
        say("no_preview", "frame %d: %s" % (frame, error))
    finally:
        bpy.data.images.remove(image)

if options["render"]:
    scene.render.engine = "CYCLES"
    scene.cycles.use_denoising = False
    for layer in scene.view_layers:
        if hasattr(layer, "cycles"):
            layer.cycles.use_denoising = False
    if scene.node_tree is not None:
        for node in scene.node_tree.nodes:
            if node.type == "DENOISE":
                node.mute = True
    if options["samples"]:
        scene.cycles.samples = options["samples"]
    if options["percentage"]:
        scene.render.resolution_percentage = options["percentage"]
    sides = (scene.render.resolution_x, scene.render.resolution_y)
    size = [side * scene.render.resolution_percentage // 100 for side in sides]
    if options["max_side"] and max(size) > options["max_side"]:
        say("too_large", size)
        raise RuntimeError("the frames would be %d x %d pixels: not rendered" % tuple(size))
    if options["time_limit"]:
        # The probe's bound on each frame's sampling; a scene's own lower limit stands (it binds the job too).
        own = getattr(scene.cycles, "time_limit", 0.0)
        if not own or options["time_limit"] < own:
            scene.cycles.time_limit = options["time_limit"]
            say("time_limit", options["time_limit"])
    if options["only_frame"] is not None:
        frame = scene.frame_start if options["only_frame"] < 0 else options["only_frame"]
        scene.frame_start = scene.frame_end = frame
        scene.frame_step = 1
    used = "CPU"
    preferences = bpy.context.preferences.addons["cycles"].preferences
    kernels = os.path.join(os.path.dirname(sys.modules["cycles"].__file__), "lib")
    for kind in options["gpu"]:
        try:
            preferences.compute_device_type = kind
        except TypeError:
            say("note", kind + ": not in this Blender build")
            continue
        getattr(preferences, "refresh_devices", preferences.get_devices)()
        if not any(device.type == kind for device in preferences.devices):
            say("note", kind + ": no device")
            continue
        # Without kernels built for it (or nvcc to build them) Cycles finds the GPU, then fails the render.
        built = [found for pattern in KERNELS.get(kind, []) for found in glob.glob(os.path.join(kernels, pattern))]
        if not built and not (kind == "CUDA" and shutil.which("nvcc")):
            say("note", kind + ": a device, but this Blender build has no kernels for it")
            continue
        for device in preferences.devices:
            device.use = device.type == kind
        used = kind
        break
    scene.cycles.device = "CPU" if used == "CPU" else "GPU"
    say("device", used)
    if options["preview"]:
        OUT, PREVIEW = options["out"], preview_scene()
        bpy.app.handlers.render_write.append(write_preview)
"""


def new_mark() -> str:
    return f"gpu-portal-{secrets.token_hex(8)}"


def frame_argument(frames: Sequence[int]) -> str:
    """Frames as Blender's ``-f`` takes them, ascending runs as ranges: ``1..3,7,9..12``."""
    ordered = sorted(set(frames))
    if not ordered:
        raise ValueError("no frames to render")
    if ordered[0] < 0 or ordered[-1] > MAX_FRAME:
        raise ValueError(f"frames must lie between 0 and {MAX_FRAME}")
    runs: list[list[int]] = []
    for frame in ordered:
        if runs and frame == runs[-1][-1] + 1:
            runs[-1].append(frame)
        else:
            runs.append([frame])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)


def scene_path(blend: str) -> str:
    """Where the main .blend lies inside the sandbox; refuses a path that could leave the scene folder."""
    path = PurePosixPath(blend)
    if path.is_absolute() or not path.parts or ".." in path.parts or path.suffix.lower() != ".blend":
        raise ValueError(f"not a .blend inside the scene folder: {blend!r}")
    return str(PurePosixPath(SCENE_DIR) / path)


def frame_file(frame: int, file_format: str = "PNG") -> str:
    """The name Blender gives a frame's file in the output folder."""
    return f"{FRAME_NAME.rstrip('#')}{frame:0{FRAME_NAME.count('#')}d}.{FORMATS[file_format]}"


def preview_file(frame: int) -> str:
    """The name of a frame's small PNG in the output folder, where the render was asked for one."""
    return PREVIEW_NAME.format(frame)


def format_refusal(file_format: str, writes: Sequence[str] | None) -> str | None:
    """Why this Blender build cannot render to ``file_format``, as its run said; None if it can (or did not say)."""
    if writes is None or file_format in writes:
        return None
    return f"this Blender build cannot write {FORMAT_NAMES[file_format]} files; choose {FORMAT_NAMES['PNG']} instead"


@dataclass(frozen=True)
class RenderSettings:
    """How to render: optional samples and resolution overrides, the output format, and the Cycles GPU
    backends to try in order (none: the CPU, as where the GPU is simulated)."""

    samples: int | None = None
    percentage: int | None = None
    file_format: str = "PNG"
    gpu: tuple[str, ...] = ()
    preview_pixels: int = 0  # >0: a PNG of each frame this many pixels on its longest side (``preview_file``)
    max_side: int = 0  # >0: frames wider or taller than this are not rendered (Blender exits first)

    def __post_init__(self) -> None:
        if self.file_format not in FORMATS:
            raise ValueError(f"output format must be one of {', '.join(FORMATS)}")
        if not 0 <= self.preview_pixels <= 4096:
            raise ValueError("preview pixels must lie between 0 and 4096")
        if self.samples is not None and not 1 <= self.samples <= 1 << 24:
            raise ValueError("samples must lie between 1 and 16777216")
        if self.percentage is not None and not 1 <= self.percentage <= 100:
            raise ValueError("resolution percentage must lie between 1 and 100")
        if self.max_side < 0:
            raise ValueError("the largest side must not be negative")


def cycles_gpu(simulated: bool) -> tuple[str, ...]:
    """The Cycles backends a slice's GPU is tried with: none where the GPU is simulated (there is no
    device to find, Cycles renders on the CPU), OptiX then CUDA on a real one."""
    return () if simulated else ("OPTIX", "CUDA")


def _options(
    mark: str, *, render: RenderSettings | None = None, only_frame: int | None = None, time_limit: float = 0.0
) -> str:
    return json.dumps(
        {
            "mark": mark,
            "render": render is not None,
            "samples": render.samples if render else None,
            "percentage": render.percentage if render else None,
            "gpu": list(render.gpu) if render else [],
            "only_frame": only_frame,
            "time_limit": time_limit,
            "formats": list(FORMATS),
            "preview": render.preview_pixels if render and only_frame is None else 0,
            "max_side": render.max_side if render else 0,
            "preview_name": PREVIEW_NAME,
            "out": OUTPUT_DIR,
        }
    )


def _start(blend: str) -> list[str]:
    return [*LINE_BUFFERED, BLENDER, *SAFE_FLAGS, scene_path(blend)]


def _python(options: str) -> tuple[list[str], list[str]]:
    """Our Python (it must come before -f or -a) and, last of all, its options."""
    return ["--python-exit-code", str(PYTHON_FAILED), "--python-expr", IN_BLENDER], ["--", options]


def _output(file_format: str, threads: int) -> list[str]:
    return ["-o", f"{OUTPUT_DIR}/{FRAME_NAME}", "-F", file_format, "-x", "1", "-t", str(max(1, threads))]


def facts_command(blend: str, mark: str) -> list[str]:
    """Read the scene's facts and render nothing."""
    python, options = _python(_options(mark))
    return [*_start(blend), *python, *options]


def render_command(blend: str, frames: Sequence[int], settings: RenderSettings, mark: str, threads: int) -> list[str]:
    """Render frames into the output folder (facts first, then Cycles set up, then the frames)."""
    python, options = _python(_options(mark, render=settings))
    return [*_start(blend), *_output(settings.file_format, threads), *python, "-f", frame_argument(frames), *options]


def probe_command(
    blend: str,
    settings: RenderSettings,
    mark: str,
    threads: int,
    frames: Sequence[int] | None = None,
    time_limit: float = 0.0,
) -> list[str]:
    """Render a few frames as the job would, the scene's first unless told (which one that is is known only
    once it is read), each frame's sampling stopped after ``time_limit`` seconds (0: never); no previews."""
    quiet = replace(settings, preview_pixels=0)
    which = ["-f", frame_argument(frames)] if frames else ["-a"]
    python, options = _python(_options(mark, render=quiet, only_frame=None if frames else -1, time_limit=time_limit))
    return [*_start(blend), *_output(settings.file_format, threads), *python, *which, *options]
