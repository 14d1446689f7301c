"""What we ask Blender (command lines) and what we accept as a scene's facts: pure, no engine."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessions.runtime import blender
from sessions.runtime.blender import RenderSettings, cycles_gpu, frame_argument, frame_file, scene_path
from sessions.runtime.scene_facts import SceneFacts, SceneFactsError

FACTS: dict[str, Any] = {
    "file": "/scene/shot/main.blend",
    "version": [3, 4, 1],
    "scene": "Scene",
    "scenes": 1,
    "frame_start": 1,
    "frame_end": 250,
    "frame_step": 1,
    "fps": 24.0,
    "resolution_x": 1920,
    "resolution_y": 1080,
    "resolution_percentage": 50,
    "engine": "BLENDER_EEVEE",
    "camera": True,
    "samples": 4096,
    "file_format": "PNG",
}


def test_frames_are_given_to_blender_as_ascending_runs() -> None:
    assert frame_argument([3, 1, 2, 7, 9, 10, 11, 12, 7]) == "1..3,7,9..12"
    assert frame_argument([5]) == "5"


@pytest.mark.parametrize("frames", [[], [-1], [blender.MAX_FRAME + 1]])
def test_no_frames_negative_frames_or_frames_beyond_blenders_maximum_are_refused(frames: list[int]) -> None:
    with pytest.raises(ValueError):
        frame_argument(frames)


def test_a_probe_of_a_frame_blender_cannot_render_is_refused() -> None:
    with pytest.raises(ValueError):
        blender.probe_command("a.blend", RenderSettings(), "m", threads=1, frames=[1, -3])


@pytest.mark.parametrize("blend", ["/etc/passwd.blend", "../other/x.blend", "a/../../x.blend", "scene.py", ""])
def test_a_main_file_outside_the_scene_folder_or_not_a_blend_is_refused(blend: str) -> None:
    with pytest.raises(ValueError):
        scene_path(blend)


def test_the_main_file_lies_under_the_read_only_scene_mount() -> None:
    assert scene_path("shot/main.blend") == "/scene/shot/main.blend"


def test_every_command_disables_the_files_scripts_and_uses_factory_settings_first() -> None:
    mark = blender.new_mark()
    commands = [
        blender.facts_command("a.blend", mark),
        blender.render_command("a.blend", (1, 2, 3), RenderSettings(), mark, threads=2),
        blender.probe_command("a.blend", RenderSettings(samples=4), mark, threads=2),
    ]
    for command in commands:
        assert command[3:8] == ["blender", "-b", "-Y", "--factory-startup", "/scene/a.blend"]
        assert "-y" not in command and "--enable-autoexec" not in command
        # Our Python fails the run (exit status 3) rather than let an unprepared scene render.
        assert command[command.index("--python-exit-code") + 1] == "3"
        assert command[-2] == "--" and json.loads(command[-1])["mark"] == mark


def test_a_render_writes_only_to_the_output_folder_with_the_slices_threads_and_renders_last() -> None:
    command = blender.render_command("a.blend", (4, 5, 6), RenderSettings(file_format="OPEN_EXR"), "m", threads=6)
    assert command[command.index("-o") + 1] == "/out/frame_######"
    assert command[command.index("-F") + 1] == "OPEN_EXR" and command[command.index("-t") + 1] == "6"
    # Blender acts on its arguments in order: the settings and our Python before the frames.
    assert command.index("--python-expr") < command.index("-f") == len(command) - 4
    assert command[command.index("-f") + 1] == "4..6"
    assert frame_file(4, "OPEN_EXR") == "frame_000004.exr" and frame_file(12) == "frame_000012.png"


def test_the_render_options_reach_blender_as_json_after_the_double_dash() -> None:
    settings = RenderSettings(samples=16, percentage=50, gpu=cycles_gpu(simulated=False), max_side=16384)
    command = blender.probe_command("a.blend", settings, "m", threads=1, frames=(1, 7, 12), time_limit=10.0)
    options = json.loads(command[-1])
    assert options == {
        "mark": "m",
        "render": True,
        "samples": 16,
        "percentage": 50,
        "gpu": ["OPTIX", "CUDA"],
        "only_frame": None,
        "time_limit": 10.0,
        "formats": ["PNG", "OPEN_EXR"],
        "preview": 0,
        "max_side": 16384,
        "preview_name": "preview_{:06d}.png",
        "out": "/out",
    }
    assert command[command.index("-f") + 1] == "1,7,12", "the probe renders the frames it was given, as a chunk"
    assert json.loads(blender.facts_command("a.blend", "m")[-1])["render"] is False
    assert cycles_gpu(simulated=True) == ()


def test_a_probe_told_no_frames_renders_the_scenes_first_and_stops_no_sampling_unless_told() -> None:
    command = blender.probe_command("a.blend", RenderSettings(), "m", threads=1)
    options = json.loads(command[-1])
    assert "-a" in command and "-f" not in command
    assert (options["only_frame"], options["time_limit"]) == (-1, 0.0)


def test_a_render_asks_for_previews_where_told_and_the_probe_never_does() -> None:
    exr = RenderSettings(file_format="OPEN_EXR", preview_pixels=320)
    assert json.loads(blender.render_command("a.blend", (1, 2), exr, "m", threads=1)[-1])["preview"] == 320
    assert json.loads(blender.probe_command("a.blend", exr, "m", threads=1)[-1])["preview"] == 0
    assert blender.preview_file(12) == "preview_000012.png"
    with pytest.raises(ValueError, match="preview pixels"):
        RenderSettings(preview_pixels=5000)


def test_a_format_the_build_does_not_write_is_refused_in_words() -> None:
    assert blender.format_refusal("OPEN_EXR", ("PNG",)) == (
        "this Blender build cannot write OpenEXR files; choose PNG instead"
    )
    assert blender.format_refusal("OPEN_EXR", ("PNG", "OPEN_EXR")) is None
    assert blender.format_refusal("OPEN_EXR", None) is None, "a run that did not say is judged by its frames"


@pytest.mark.parametrize(
    ("samples", "percentage", "file_format"),
    [(0, None, "PNG"), (None, 0, "PNG"), (None, 101, "PNG"), (None, None, "AVI_JPEG")],
)
def test_render_settings_out_of_range_are_refused(
    samples: int | None, percentage: int | None, file_format: str
) -> None:
    with pytest.raises(ValueError):
        RenderSettings(samples=samples, percentage=percentage, file_format=file_format)


def test_scene_facts_are_read_from_blenders_json() -> None:
    facts = SceneFacts.from_json(FACTS, "/scene/shot/main.blend")
    assert facts.frames == range(1, 251) and facts.size == (960, 540)
    assert facts.engine == "BLENDER_EEVEE" and facts.camera is True and facts.version == (3, 4, 1)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"file": "/scene/other.blend"}, "not '/scene/shot/main.blend'"),
        ({"frame_start": 10, "frame_end": 2}, "ends (2) before it starts (10)"),
        ({"frame_start": -5}, "frame_start"),
        ({"frame_end": "250"}, "frame_end"),
        ({"resolution_x": True}, "resolution_x"),
        ({"resolution_y": 0}, "resolution_y"),
        ({"engine": "CYCLES; rm -rf /"}, "engine"),
        ({"engine": None}, "engine"),
        ({"camera": 1}, "camera"),
        ({"scene": "x" * 200}, "scene"),
        ({"scene": "Scene\n<script>"}, "control characters"),
        ({"fps": float("nan")}, "fps"),
        ({"version": [3, 4]}, "version"),
        ({"samples": 0}, "samples"),
    ],
)
def test_scene_facts_that_are_not_what_blender_prints_are_refused(change: dict[str, Any], words: str) -> None:
    with pytest.raises(SceneFactsError) as refused:
        SceneFacts.from_json({**FACTS, **change}, "/scene/shot/main.blend")
    assert words in str(refused.value)


@pytest.mark.parametrize("garbage", [None, [], "facts", 42, {}])
def test_anything_but_an_object_of_facts_is_refused(garbage: Any) -> None:
    with pytest.raises(SceneFactsError):
        SceneFacts.from_json(garbage, "/scene/a.blend")
