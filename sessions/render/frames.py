"""Which frames a render job renders, from what its owner typed, and how they are cut into chunks.

The spec reads as Flamenco's does: ``1-30, 45, 50-60x2`` is frames 1 to 30, frame 45 and every second
frame from 50 to 60. Pure functions: the form, the job and the chunker share them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# Blender's own limit (MAXFRAME in DNA_scene_types.h): a frame past it cannot be rendered.
BLENDER_MAX_FRAME = 1_048_574
EXAMPLE = "1-250, or 1-30, 45, 50-60x2 for every second frame from 50"
EMPTY = f"Say which frames to render, e.g. {EXAMPLE}."

_PART = re.compile(r"(?P<start>\d+)(?:-(?P<end>\d+)(?:x(?P<step>\d+))?)?")
# A minus where a number starts: "-5", "1--3", "1-9x-2".
_NEGATIVE = re.compile(r"^-\s*\d|-\s*-\s*\d|x\s*-\s*\d")


class FrameSpecError(ValueError):
    """A spec that names no frames or cannot be read; the message says why, in words."""


@dataclass(frozen=True)
class FrameRange:
    start: int
    end: int
    step: int = 1

    @property
    def count(self) -> int:
        return (self.end - self.start) // self.step + 1

    def frames(self) -> range:
        return range(self.start, self.end + 1, self.step)


def parse(text: str, max_frames: int) -> tuple[int, ...]:
    """The frames ``text`` names, ascending and each once; FrameSpecError if it names none, reads
    wrongly, or names more than ``max_frames``."""
    ranges = ranges_of(text)
    frames: set[int] = set()
    for part in ranges:
        if part.count > max_frames:  # before expanding it: 1-999999999 must not build a huge set
            raise FrameSpecError(_too_many(part.count, max_frames))
        frames.update(part.frames())
        if len(frames) > max_frames:
            raise FrameSpecError(_too_many(len(frames), max_frames))
    return tuple(sorted(frames))


def ranges_of(text: str) -> list[FrameRange]:
    if not text.strip():
        raise FrameSpecError(EMPTY)
    parts = [part.strip() for part in text.split(",")]
    if "" in parts:
        raise FrameSpecError(f"'{text.strip()}' has an empty item between commas.")
    return [_range(part) for part in parts]


def _range(part: str) -> FrameRange:
    compact = re.sub(r"\s+", "", part).lower()
    found = _PART.fullmatch(compact)
    if found is None:
        if _NEGATIVE.search(compact):
            raise FrameSpecError(f"'{part}': frame numbers cannot be negative.")
        raise FrameSpecError(f"'{part}' is not a frame, a range or a stepped range; write e.g. {EXAMPLE}.")
    start = int(found["start"])
    end = int(found["end"]) if found["end"] is not None else start
    step = int(found["step"]) if found["step"] is not None else 1
    if end < start:
        raise FrameSpecError(f"'{part}' runs backwards: write the first frame first ({end}-{start}).")
    if step < 1:
        raise FrameSpecError(f"'{part}': the step after 'x' must be 1 or more.")
    if end > BLENDER_MAX_FRAME:
        raise FrameSpecError(f"'{part}': Blender renders frames up to {BLENDER_MAX_FRAME:,} only.")
    return FrameRange(start, end, step)


def _too_many(count: int, max_frames: int) -> str:
    return f"That is {count:,} frames; a job renders at most {max_frames:,}. Split it into several jobs."


def describe(frames: Sequence[int]) -> str:
    """The frames as the shortest spec that names them, for pages and logs: ``1-30, 45, 50-60x2``."""
    pieces: list[str] = []
    index = 0
    while index < len(frames):
        start = frames[index]
        if index + 1 == len(frames):
            pieces.append(str(start))
            break
        step = frames[index + 1] - start
        end_index = index + 1
        while end_index + 1 < len(frames) and frames[end_index + 1] - frames[end_index] == step:
            end_index += 1
        if end_index - index >= 2 or step == 1:
            end = frames[end_index]
            pieces.append(f"{start}-{end}" + (f"x{step}" if step > 1 else ""))
            index = end_index + 1
        else:
            pieces.append(str(start))
            index += 1
    return ", ".join(pieces)


def chunks(frames: Sequence[int], size: int) -> list[tuple[int, ...]]:
    """The job's frames cut into chunks of at most ``size`` frames each, in order."""
    if size < 1:
        raise ValueError("a chunk holds at least one frame")
    return [tuple(frames[start : start + size]) for start in range(0, len(frames), size)]
