"""Reading Blender's output, from output captured from Debian's Blender 3.4.1 in the render image.

The files in blender_output/ are what the render sandbox's containers printed (stdout and stderr together),
for the commands of ``sessions.runtime.blender`` with the mark below.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessions.runtime.blender_log import BlenderError, BlenderLog, FrameSaved, Marked, Progress, seconds
from sessions.runtime.scene_facts import SceneFacts

CAPTURED = Path(__file__).parent / "blender_output"
MARK = "gpu-portal-0123456789abcdef"


def read(name: str, mark: str | None = MARK) -> tuple[BlenderLog, list[object]]:
    log = BlenderLog(mark)
    events = [log.feed(line) for line in (CAPTURED / name).read_text().splitlines()]
    return log, [event for event in events if event is not None]


def test_fra_lines_give_each_frames_samples_and_saved_lines_its_end() -> None:
    log, events = read("render-three-frames.txt")
    sampled = [(e.frame, e.sample, e.samples) for e in events if isinstance(e, Progress) and e.sample is not None]
    assert sampled == [(frame, sample, 4) for frame in (1, 2, 3) for sample in (0, 1, 4)]
    saved = [e for e in events if isinstance(e, FrameSaved)]
    assert saved == [FrameSaved(n, f"/out/frame_00000{n}.png") for n in (1, 2, 3)]
    assert log.saved == saved and log.errors == [] and log.skipped_scripts == []
    # Before sampling, Fra: lines say what Blender prepares, with no sample yet.
    first = next(e for e in events if isinstance(e, Progress))
    assert (first.frame, first.sample, first.status) == (1, None, "Cube")
    assert isinstance(log.current, Progress) and log.current.status == "Finished"


def test_each_frame_is_timed_until_its_first_sample_its_last_and_its_file() -> None:
    log, _ = read("render-three-frames.txt")
    first = log.timings[1]
    assert (first.prepared, first.rendered, first.total) == (0.13, 0.14, 0.34)
    assert sorted(log.timings) == [1, 2, 3] and all(timing.total for timing in log.timings.values())
    assert (first.reached, first.samples) == (4, 4)
    # No limit stopped it: its time is what Blender measured.
    assert first.projected(None) == first.projected(10.0) == 0.34


def test_our_marked_lines_give_the_facts_and_the_device_and_other_lines_cannot_forge_them() -> None:
    log, events = read("render-three-frames.txt")
    assert [e.kind for e in events if isinstance(e, Marked)] == ["facts", "device"]
    assert log.last("device") == Marked("device", "CPU")
    facts = SceneFacts.from_json(log.only("facts").value, "/scene/scene.blend")
    assert (facts.frame_start, facts.frame_end, facts.resolution_x, facts.resolution_y) == (1, 3, 64, 48)
    assert facts.engine == "CYCLES" and facts.camera and facts.samples == 4
    # With another run's mark (the file cannot know ours), the same lines are nobody's facts.
    other, _ = read("render-three-frames.txt", mark="gpu-portal-fedcba9876543210")
    assert other.marked == [] and other.last("facts") is None
    with pytest.raises(ValueError, match="0 'facts' lines"):
        other.only("facts")
    # A printed line that repeats the mark is a second facts line: refused, not picked from.
    log.feed(f'{MARK} facts {{"file": "/scene/scene.blend"}}')
    with pytest.raises(ValueError, match="2 'facts' lines"):
        log.only("facts")


def test_a_failed_denoise_gives_blenders_error_with_the_lines_before_it() -> None:
    log, events = read("denoising-fails.txt", mark=None)
    assert log.saved == []
    assert log.errors == ["Error: Build without OpenImageDenoiser"]
    assert BlenderError("Error: Build without OpenImageDenoiser") in events
    assert [line.rsplit("| ", 1)[-1] for line in log.excerpt().splitlines()] == [
        "Build without OpenImageDenoiser",
        "No device available to denoise on",
        "Build without OpenImageDenoiser",  # the status of the Fra: line just before
        "Error: Build without OpenImageDenoiser",
    ]


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("not-a-blend.txt", "Error: File format is not supported in file '/scene/scene.blend'"),
        ("truncated-blend.txt", "Error: Failed to read blend file '/scene/scene.blend': Missing DNA block"),
    ],
)
def test_a_file_blender_cannot_read_is_explained_in_its_own_words_and_gives_no_facts(name: str, error: str) -> None:
    log, _ = read(name)
    assert log.errors == [error]
    assert log.excerpt().splitlines()[-1] == error
    with pytest.raises(ValueError):
        log.only("facts")


def test_the_scripts_blender_refused_to_run_are_named() -> None:
    log, _ = read("hostile-scripts-skipped.txt")
    assert log.skipped_scripts == ["autorun.py", "open('/out/driver-ran', 'w').write('ran') * 0"]
    assert log.errors == []  # a refused driver does not fail the render
    assert [saved.path for saved in log.saved] == ["/out/frame_000001.png"]


def test_a_probe_at_two_samples_is_timed() -> None:
    log, _ = read("probe.txt")
    timing = log.timings[1]
    assert (timing.prepared, timing.rendered, timing.total) == (0.06, 0.06, 0.28)
    assert [saved.frame for saved in log.saved] == [1]
    assert timing.sampling == 0.01, "sampling quicker than Blender's clock counts as its 10 ms"


def test_a_frame_whose_sampling_ran_into_the_probes_limit_is_projected_to_every_sample() -> None:
    # 100,000 samples without adaptive sampling, each frame's sampling stopped after half a second.
    log, _ = read("probe-stopped-by-its-limit.txt")
    assert log.last("time_limit") == Marked("time_limit", 0.5)
    first, last = log.timings[1], log.timings[3]
    assert (first.prepared, first.rendered, first.total) == (0.06, 0.57, 0.67)
    assert (first.reached, first.samples) == (1061, 100_000), "the highest sample it said, not the last line's 0"
    assert first.stopped_by(0.5) and last.stopped_by(0.5)
    # Its 1,061 samples took 0.51 s: the 98,939 left at that pace; preparing and saving stay as they were.
    assert first.projected_sampling(0.5) == pytest.approx(0.51 * 100_000 / 1061, abs=0.001)
    assert first.projected(0.5) == pytest.approx(0.67 + 0.51 * (100_000 / 1061 - 1), abs=0.002)
    assert first.projected(None) == 0.67, "with no limit said, nothing stopped it"


def test_a_frame_that_converged_well_within_the_limit_is_taken_as_measured() -> None:
    # 4,096 samples with adaptive sampling: every pixel converged by sample 288, in 0.04 s of a 0.5 s limit.
    log, _ = read("probe-adaptive-converged.txt")
    timing = log.timings[1]
    assert (timing.reached, timing.samples) == (288, 4096)
    assert not timing.stopped_by(0.5)
    assert timing.projected(0.5) == timing.total == 0.19


def test_blender_times_read_as_seconds() -> None:
    assert seconds("00:00.63") == 0.63
    assert seconds("01:02.50") == 62.5
    assert seconds("01:00:01.25") == 3601.25
    assert seconds("soon") is None and seconds("12") is None


def test_the_tail_keeps_only_the_last_lines_and_the_excerpt_falls_back_to_it() -> None:
    log = BlenderLog(tail_lines=3)
    for n in range(10):
        log.feed(f"line {n}")
    assert list(log.tail) == ["line 7", "line 8", "line 9"]
    assert log.excerpt() == "line 7\nline 8\nline 9"


def test_what_the_log_keeps_is_bounded_however_much_a_run_prints() -> None:
    """A run that prints 5,000 of each line the log keeps something of (errors, refused scripts, saved frames,
    frames started, our marked lines), each longer than a line it keeps: it keeps at most 1,000 of each (its
    default), every line cut short, and still explains itself by the first error and the last ones."""
    log = BlenderLog(MARK)
    long = "x" * 3000
    for number in range(5000):
        log.feed(f"Error: number {number} {long}")
        log.feed(f"scripts disabled for \"/scene/a.blend\", skipping 'text{number}.py{long}'")
        log.feed(f"Fra:{number} Mem:1.00M (Peak 1.00M) | Time:00:00.10 | Scene, ViewLayer | Sample 1/4")
        log.feed(f"Saved: '/out/frame_{number:06d}.png{long}'")
        log.feed(f"{MARK} note {number}")
    excerpt = log.excerpt(10**9).splitlines()
    kept = [len(log.errors), len(log.skipped_scripts), len(log.saved), len(log.marked), len(log.timings), len(excerpt)]
    assert all(count <= 1000 for count in kept), kept
    assert all(len(line) <= 2000 for line in [*log.errors, *log.tail, *excerpt])
    assert log.errors[0].startswith("Error: number 0 ") and log.excerpt(1).startswith("Error: number 4999 ")
    assert log.last("note") is not None
    with pytest.raises(ValueError, match="0 'facts' lines"):
        log.only("facts")
