"""A scene's facts as Blender read them from an uploaded file: frames, resolution, engine, camera.

Pure (no Django, no Docker). Blender prints them as JSON on our marked line (``sessions.runtime.blender``);
``SceneFacts.from_json`` takes nothing on trust: every field is checked for its type and range, so a file
that made Blender print something odd is refused rather than shown or used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sessions.runtime.blender import MAX_FRAME

_IDENTIFIER = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")  # Blender's enum identifiers: CYCLES, BLENDER_EEVEE, PNG
_NAME_CHARS = 64  # Blender's names hold 63 bytes


class SceneFactsError(ValueError):
    """What Blender printed is not a scene's facts; the message says which part is wrong."""


def _int(data: dict[str, Any], key: str, low: int, high: int) -> int:
    value = data.get(key)
    if type(value) is not int or not low <= value <= high:
        raise SceneFactsError(f"{key} is not a whole number between {low} and {high}: {value!r}")
    return value


def _text(data: dict[str, Any], key: str, pattern: re.Pattern[str] | None = None) -> str:
    value = data.get(key)
    if not isinstance(value, str) or len(value) > (_NAME_CHARS if pattern is None else 4096):
        raise SceneFactsError(f"{key} is not a short text: {value!r}")
    if pattern is not None and not pattern.match(value):
        raise SceneFactsError(f"{key} is not an identifier: {value!r}")
    if pattern is None and any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise SceneFactsError(f"{key} holds control characters")
    return value


@dataclass(frozen=True)
class SceneFacts:
    scene: str
    scenes: int
    frame_start: int
    frame_end: int
    frame_step: int
    fps: float
    resolution_x: int
    resolution_y: int
    resolution_percentage: int
    engine: str
    camera: bool
    samples: int | None
    file_format: str
    version: tuple[int, int, int]  # the Blender that saved the file

    @property
    def frames(self) -> range:
        return range(self.frame_start, self.frame_end + 1, self.frame_step)

    @property
    def size(self) -> tuple[int, int]:
        """The frame's pixels at the scene's resolution percentage."""
        scale = self.resolution_percentage / 100
        return max(1, int(self.resolution_x * scale)), max(1, int(self.resolution_y * scale))

    def size_at(self, percentage: int | None) -> tuple[int, int]:
        """The frame's pixels as Blender renders it at ``percentage`` (None: the scene's own): each side times
        the percentage, rounded down."""
        scale = self.resolution_percentage if percentage is None else percentage
        return self.resolution_x * scale // 100, self.resolution_y * scale // 100

    @classmethod
    def from_json(cls, data: Any, expected_file: str) -> SceneFacts:
        """The facts of the file Blender was asked to read; SceneFactsError if they are not that."""
        if not isinstance(data, dict):
            raise SceneFactsError(f"the scene's facts are not an object: {type(data).__name__}")
        if data.get("file") != expected_file:
            raise SceneFactsError(f"Blender read {data.get('file')!r}, not {expected_file!r}")
        start = _int(data, "frame_start", 0, MAX_FRAME)
        end = _int(data, "frame_end", 0, MAX_FRAME)
        if end < start:
            raise SceneFactsError(f"the frame range ends ({end}) before it starts ({start})")
        version = data.get("version")
        if not isinstance(version, list) or len(version) != 3 or any(type(part) is not int for part in version):
            raise SceneFactsError(f"version is not three whole numbers: {version!r}")
        fps = data.get("fps")
        if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps <= 1000:
            raise SceneFactsError(f"fps is not a rate: {fps!r}")
        camera, samples = data.get("camera"), data.get("samples")
        if not isinstance(camera, bool):
            raise SceneFactsError(f"camera is not true or false: {camera!r}")
        return cls(
            scene=_text(data, "scene"),
            scenes=_int(data, "scenes", 1, 10_000),
            frame_start=start,
            frame_end=end,
            frame_step=_int(data, "frame_step", 1, MAX_FRAME),
            fps=float(fps),
            resolution_x=_int(data, "resolution_x", 1, 65_536),
            resolution_y=_int(data, "resolution_y", 1, 65_536),
            resolution_percentage=_int(data, "resolution_percentage", 1, 32_767),
            engine=_text(data, "engine", _IDENTIFIER),
            camera=camera,
            samples=None if samples is None else _int(data, "samples", 1, 1 << 24),
            file_format=_text(data, "file_format", _IDENTIFIER),
            version=(version[0], version[1], version[2]),
        )
