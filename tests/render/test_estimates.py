"""The estimate's rule (``sessions.render.estimates``): chunks, the slices that take them, what each is held
and billed. Pure: no database, no Docker."""

from __future__ import annotations

import pytest

from sessions.render.estimates import Sharing, chunk_sizes, plan, probe_frames, sharing, slices_for


def test_a_chunks_overhead_is_paid_once_per_chunk_and_each_frame_at_the_probes_time() -> None:
    # 10 frames in chunks of 4: 4, 4 and 2 frames, three container runs on the one slice.
    planned = plan(10, 4, 1, per_frame_s=0.5, per_chunk_s=1.25)
    assert chunk_sizes(10, 4) == [4, 4, 2]
    assert planned.chunks == 3 and planned.held_s == (3 * 1.25 + 10 * 0.5,)
    assert planned.total_seconds == 8.75 and planned.minutes == 1


def test_slices_take_the_next_chunk_as_each_comes_free_and_each_is_billed_its_own_started_minutes() -> None:
    # Five chunks of 60 s on two slices: one takes three of them, the other two.
    planned = plan(5, 1, 2, per_frame_s=50.0, per_chunk_s=10.0)
    assert planned.slices == 2 and sorted(planned.held_s) == [120.0, 180.0]
    assert planned.total_seconds == 180.0
    assert planned.minutes == 2 + 3, "each slice's holding is billed on its own, each started minute"
    # A last chunk that is short lands on the slice free first.
    assert sorted(plan(3, 2, 2, per_frame_s=1.0, per_chunk_s=0.0).held_s) == [1.0, 2.0]


def test_never_more_slices_than_chunks_and_always_one() -> None:
    assert slices_for(3, 4, 8) == 1 and slices_for(12, 4, 8) == 3 and slices_for(0, 4, 2) == 1
    assert plan(3, 4, 8, per_frame_s=1.0, per_chunk_s=1.0).slices == 1


def test_slices_rendering_on_the_cpu_share_the_hosts_cores_for_sampling_and_on_a_gpu_do_not() -> None:
    # Two slices of 2 threads each on a 2-core host take turns sampling; syncing and saving take a core each.
    assert sharing(2, threads=2, host_cpus=2, on_cpu=True) == Sharing(sampling=2.0, serial=1.0)
    assert sharing(1, threads=2, host_cpus=2, on_cpu=True) == Sharing()
    assert sharing(4, threads=2, host_cpus=16, on_cpu=True) == Sharing()
    assert sharing(4, threads=1, host_cpus=2, on_cpu=True) == Sharing(sampling=2.0, serial=2.0)
    assert sharing(2, threads=2, host_cpus=2, on_cpu=False) == Sharing()
    # A frame of 1.5 s, 1.25 of them sampling: the sampling takes twice as long, the rest as long as it did.
    assert Sharing(sampling=2.0).frame(1.5, sampling=1.25) == 2.75
    # Sampling-bound frames on shared cores: two slices are held as long as one would be, and billed twice.
    per_frame = Sharing(sampling=2.0).frame(20.0, sampling=20.0)
    alone, shared = plan(4, 1, 1, 20.0, per_chunk_s=0.0), plan(4, 1, 2, per_frame, per_chunk_s=0.0)
    assert shared.held_s == (alone.total_seconds, alone.total_seconds) and shared.minutes == 2 * alone.minutes


@pytest.mark.parametrize(
    ("frames", "probed"),
    [
        ([5], (5,)),
        ([1, 2], (1, 2)),
        ([1, 2, 3], (1, 2, 3)),
        (list(range(1, 25)), (1, 12, 24)),
        ([4, 9, 40, 41], (4, 9, 41)),
    ],
)
def test_the_probe_renders_the_jobs_first_middle_and_last_frames(frames: list[int], probed: tuple[int, ...]) -> None:
    assert probe_frames(frames) == probed
