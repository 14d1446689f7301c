"""Reading what Blender prints while it renders: progress, finished frames, timings, errors, our marked lines.

Pure (no Django, no Docker). ``BlenderLog.feed`` takes one line at a time as the container prints it and
returns what the line means, if anything; the log keeps what a job needs afterwards (saved frames, each
frame's timing, the scripts Blender refused to run, an excerpt that explains a failure). Scene facts come
from our own Python's marked line and are checked here: a file's contents are untrusted. What a run prints
is not bounded, so what the log keeps is: at most ``most_kept`` of each kind of thing, each line cut to
``LONGEST_KEPT`` characters.
"""

from __future__ import annotations

import json
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

# Fra:1 Mem:9.62M (Peak 9.63M) | Time:00:00.41 | Remaining:00:00.03 | Mem:1.20M, Peak:1.20M | Scene, ViewLayer
#   | Sample 1/4
_FRA = re.compile(r"^Fra:(?P<frame>-?\d+) ")
_ELAPSED = re.compile(r"\| Time:(?P<time>[\d:.]+) \|")
_SAMPLE = re.compile(r"Sample (?P<sample>\d+)/(?P<samples>\d+)")
_SAVED = re.compile(r"^Saved: '(?P<path>.*)'$")
#  Time: 00:00.61 (Saving: 00:00.01)
_FRAME_TIME = re.compile(r"^\s*Time: (?P<time>[\d:.]+) \(Saving: (?P<saving>[\d:.]+)\)")
# Blender's own errors, and the last line of a Python traceback.
_ERROR = re.compile(r"^(Error: |[A-Za-z_.]*(Error|Exception): )")
# With scripts disabled (-Y), Blender skips a file's registered text blocks, and evaluates a scripted
# driver only as a restricted expression, refusing any name outside its few math functions.
_SKIPPED_TEXT = re.compile(r"^scripts disabled for \".*\", skipping '(?P<name>.*)'$")
_SKIPPED_DRIVER = re.compile(r"^Error in PyDriver: expression failed: (?P<name>.*)$")
CONTEXT_LINES = 3
CLOCK = 0.01  # Blender prints times to the hundredth of a second
# Cycles stops a frame's sampling at its time limit, give or take a sample: one that sampled this share of the
# limit and stopped before its last sample was stopped by it.
STOPPED_BY_LIMIT = 0.9
EXCERPT_LINES = 20
MOST_KEPT = 1000  # of each: errors, refused scripts, saved frames, frames timed, marked lines, excerpt lines
LONGEST_KEPT = 2000  # characters of a line kept


def _cut(line: str) -> str:
    return line if len(line) <= LONGEST_KEPT else line[: LONGEST_KEPT - 1] + "…"


def seconds(text: str) -> float | None:
    """Blender's ``[HH:]MM:SS.ss`` as seconds; None if it is not that."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 3:
        return None
    try:
        values = [float(part) for part in parts]
    except ValueError:
        return None
    total = 0.0
    for value in values:
        total = total * 60 + value
    return round(total, 3)


@dataclass(frozen=True)
class Progress:
    """A ``Fra:`` line: the frame being rendered, the sample reached (None while it prepares), what it does."""

    frame: int
    elapsed: float | None
    sample: int | None
    samples: int | None
    status: str


@dataclass(frozen=True)
class FrameSaved:
    frame: int | None
    path: str


@dataclass(frozen=True)
class BlenderError:
    message: str


@dataclass(frozen=True)
class Marked:
    """A line of our own Python, after its mark: ``facts {...}``, ``device CPU``."""

    kind: str
    value: Any


Event = Progress | FrameSaved | BlenderError | Marked


@dataclass
class FrameTiming:
    """How long a frame took: until its first sample (scene sync, BVH, kernels), until it finished
    sampling, and in all with saving, as Blender measured them (seconds); and the highest sample it said it
    reached, of how many."""

    frame: int
    prepared: float | None = None
    rendered: float | None = None
    total: float | None = None
    reached: int | None = None
    samples: int | None = None

    @property
    def sampling(self) -> float | None:
        """Seconds from its first sample to its last (at least Blender's clock)."""
        if self.total is None:
            return None
        prepared = self.prepared if self.prepared is not None else 0.0
        rendered = self.rendered if self.rendered is not None else self.total
        return max(CLOCK, rendered - prepared)

    def stopped_by(self, limit_s: float | None) -> bool:
        """Whether its sampling ran into a time limit of ``limit_s`` seconds before its last sample. A frame
        that stopped early well within the limit converged (adaptive sampling): it took what it takes."""
        sampling = self.sampling
        if limit_s is None or sampling is None or not self.reached or not self.samples:
            return False
        return self.reached < self.samples and sampling >= STOPPED_BY_LIMIT * limit_s

    def projected_sampling(self, limit_s: float | None) -> float | None:
        """Its sampling had it not been stopped at ``limit_s`` seconds: as measured where it was not; else
        its samples left at the pace of those it took (with adaptive sampling, the samples left would be
        fewer and cheaper, so this errs high)."""
        sampling = self.sampling
        if sampling is None or not self.stopped_by(limit_s) or not self.reached or not self.samples:
            return sampling
        return round(sampling * self.samples / self.reached, 3)

    def projected(self, limit_s: float | None) -> float | None:
        """Its time had its sampling not been stopped at ``limit_s`` seconds (``projected_sampling``):
        preparing and saving stay as they were."""
        sampling, projected = self.sampling, self.projected_sampling(limit_s)
        if self.total is None or sampling is None or projected is None:
            return None
        return round(self.total + projected - sampling, 3)


@dataclass
class BlenderLog:
    """Blender's output, read line by line. ``mark`` is the run's mark (``blender.new_mark``); ``most_kept``
    bounds each list kept (the first ones stay; of the excerpt, the last ones)."""

    mark: str | None = None
    tail_lines: int = 40
    most_kept: int = MOST_KEPT
    current: Progress | None = None
    saved: list[FrameSaved] = field(default_factory=list)
    timings: dict[int, FrameTiming] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped_scripts: list[str] = field(default_factory=list)
    marked: list[Marked] = field(default_factory=list)
    tail: deque[str] = field(init=False)
    _excerpt: deque[str] = field(init=False)
    _marked_count: Counter[str] = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        self.tail = deque(maxlen=self.tail_lines)
        self._excerpt = deque(maxlen=self.most_kept)

    def feed(self, line: str) -> Event | None:
        line = _cut(line.rstrip("\r\n"))
        event = self._marked(line) or self._event(line)
        if not isinstance(event, Marked):
            self._keep(line, isinstance(event, BlenderError))
        return event

    def _add(self, kept: list[Any], item: object) -> None:
        if len(kept) < self.most_kept:
            kept.append(item)

    def _marked(self, line: str) -> Marked | None:
        if not self.mark or not line.startswith(f"{self.mark} "):
            return None
        kind, _, text = line[len(self.mark) + 1 :].partition(" ")
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        found = Marked(kind, value)
        self._marked_count[kind] += 1
        self._add(self.marked, found)
        return found

    def _event(self, line: str) -> Event | None:
        if fra := _FRA.match(line):
            return self._progress(int(fra["frame"]), line)
        if saved := _SAVED.match(line):
            frame = self.current.frame if self.current else None
            found = FrameSaved(frame, saved["path"])
            self._add(self.saved, found)
            return found
        if (took := _FRAME_TIME.match(line)) and self.current:
            self._timing(self.current.frame).total = seconds(took["time"])
            return None
        if _ERROR.match(line):
            self._add(self.errors, line)
            return BlenderError(line)
        if skipped := _SKIPPED_TEXT.match(line) or _SKIPPED_DRIVER.match(line):
            self._add(self.skipped_scripts, skipped["name"])
        return None

    def _progress(self, frame: int, line: str) -> Progress:
        elapsed_match = _ELAPSED.search(line)
        elapsed = seconds(elapsed_match["time"]) if elapsed_match else None
        sample = _SAMPLE.search(line)
        status = line.rsplit("|", 1)[-1].strip()
        progress = Progress(
            frame,
            elapsed,
            int(sample["sample"]) if sample else None,
            int(sample["samples"]) if sample else None,
            status,
        )
        timing = self._timing(frame)
        if progress.sample is not None:
            if timing.prepared is None:
                timing.prepared = elapsed
            timing.reached = max(timing.reached or 0, progress.sample)
            timing.samples = progress.samples
        if status == "Finished":
            timing.rendered = elapsed
        self.current = progress
        return progress

    def _timing(self, frame: int) -> FrameTiming:
        """The frame's timing; past ``most_kept`` frames, a new frame's is timed and not kept."""
        if frame not in self.timings and len(self.timings) >= self.most_kept:
            return FrameTiming(frame)
        return self.timings.setdefault(frame, FrameTiming(frame))

    def _keep(self, line: str, is_error: bool) -> None:
        """The tail, and the excerpt: each error with the lines just before it, once."""
        if is_error:
            recent = list(self._excerpt)[-CONTEXT_LINES - 1 :]
            for before in list(self.tail)[-CONTEXT_LINES:]:
                if before not in recent:
                    self._excerpt.append(before)
            self._excerpt.append(line)
        self.tail.append(line)

    def excerpt(self, lines: int = EXCERPT_LINES) -> str:
        """The lines that explain a failure: Blender's errors with their context, else the last lines."""
        chosen = list(self._excerpt) if self._excerpt else list(self.tail)
        return "\n".join(chosen[-lines:])

    def last(self, kind: str) -> Marked | None:
        found = [item for item in self.marked if item.kind == kind]
        return found[-1] if found else None

    def only(self, kind: str) -> Marked:
        """The one marked line of this kind; ValueError if there is none or more than one (counted even
        past ``most_kept``)."""
        found = [item for item in self.marked if item.kind == kind]
        if self._marked_count[kind] != 1 or len(found) != 1:
            raise ValueError(f"Blender printed {self._marked_count[kind]} '{kind}' lines, not one")
        return found[0]
