"""The frame spec people type (Flamenco's style), what it names, and the refusals, in words."""

from __future__ import annotations

import pytest

from sessions.render import frames
from sessions.render.frames import FrameSpecError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", (1,)),
        ("0", (0,)),
        ("1-5", (1, 2, 3, 4, 5)),
        ("1-10x3", (1, 4, 7, 10)),
        ("1-9X4", (1, 5, 9)),
        (" 3 - 5 ,7", (3, 4, 5, 7)),
        ("1-3, 2-4", (1, 2, 3, 4)),
        ("10, 1-2", (1, 2, 10)),
    ],
)
def test_a_spec_names_its_frames_ascending_and_each_once(text: str, expected: tuple[int, ...]) -> None:
    assert frames.parse(text, 100) == expected


def test_the_flamenco_example_reads_as_flamenco_reads_it() -> None:
    parsed = frames.parse("1-30, 45, 50-60x2", 1000)
    assert parsed == (*range(1, 31), 45, 50, 52, 54, 56, 58, 60)
    assert frames.describe(parsed) == "1-30, 45, 50-60x2"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "Say which frames to render"),
        ("   ", "Say which frames to render"),
        ("1-5,", "empty item between commas"),
        ("1,,2", "empty item between commas"),
        ("30-1", "runs backwards: write the first frame first (1-30)"),
        ("-5", "cannot be negative"),
        ("-5-3", "cannot be negative"),
        ("1--3", "cannot be negative"),
        ("abc", "is not a frame, a range or a stepped range"),
        ("1-", "is not a frame, a range or a stepped range"),
        ("1..5", "is not a frame, a range or a stepped range"),
        ("1-5x", "is not a frame, a range or a stepped range"),
        ("1.5", "is not a frame, a range or a stepped range"),
        ("1-5x0", "the step after 'x' must be 1 or more"),
        ("1-2000000", "Blender renders frames up to 1,048,574 only"),
    ],
)
def test_a_spec_that_names_no_frames_or_reads_wrongly_is_refused_in_words(text: str, words: str) -> None:
    with pytest.raises(FrameSpecError) as refused:
        frames.parse(text, 100)
    assert words in str(refused.value)


def test_more_frames_than_the_maximum_are_refused_without_expanding_a_huge_range() -> None:
    with pytest.raises(FrameSpecError) as refused:
        frames.parse("1-1000000", 10_000)
    assert "That is 1,000,000 frames; a job renders at most 10,000" in str(refused.value)


def test_the_maximum_counts_frames_after_overlaps_merge() -> None:
    assert len(frames.parse("1-100, 50-150", 150)) == 150
    with pytest.raises(FrameSpecError) as refused:
        frames.parse("1-100, 50-151", 150)
    assert "That is 151 frames" in str(refused.value)


def test_chunks_cut_the_frames_in_order_with_a_shorter_last_one() -> None:
    assert frames.chunks((1, 2, 3, 4, 5, 7, 9), 3) == [(1, 2, 3), (4, 5, 7), (9,)]
    with pytest.raises(ValueError):
        frames.chunks((1,), 0)
