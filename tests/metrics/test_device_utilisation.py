"""Reading each device's utilisation back out of the latest fleet frames, which are data, never trusted."""

from __future__ import annotations

import json

from sessions.metrics.frames import device_utilisation, dumps

NOW = 1_764_470_000.0


def frame(t: float, gpus: list[object]) -> str:
    return dumps({"kind": "fleet", "agent": "sim-1", "t": t, "gpus": gpus})


def test_gpus_and_mig_devices_are_found_by_uuid_and_none_stays_none() -> None:
    mig = {"uuid": "GPU-a", "util": None, "devices": [{"uuid": "MIG-1", "util": 55.5}, {"uuid": "MIG-2", "util": 0}]}
    whole = {"uuid": "GPU-b", "util": 12, "devices": []}
    found = device_utilisation([frame(NOW - 1, [mig]), frame(NOW, [whole])], NOW, max_age_s=10)
    assert found == {"GPU-a": None, "MIG-1": 55.5, "MIG-2": 0.0, "GPU-b": 12.0}


def test_a_frame_from_an_agent_gone_quiet_says_nothing() -> None:
    gpu = {"uuid": "GPU-a", "util": 40.0, "devices": []}
    assert device_utilisation([frame(NOW - 11, [gpu])], NOW, max_age_s=10) == {}


def test_anything_that_is_not_one_of_our_frames_is_skipped() -> None:
    odd = [
        "not json",
        json.dumps([1, 2]),
        json.dumps({"t": "soon", "gpus": [{"uuid": "GPU-x", "util": 1}]}),
        frame(NOW, "gpus"),  # type: ignore[arg-type]
        frame(NOW, [7, {"util": 3}, {"uuid": 5, "util": 3}]),
        frame(NOW, [{"uuid": "GPU-y", "util": True, "devices": "none"}]),
        frame(NOW, [{"uuid": "GPU-z", "util": "<b>9</b>", "devices": [{"uuid": "MIG-z", "util": float("nan")}]}]),
    ]
    assert device_utilisation(odd, NOW, max_age_s=10) == {"GPU-y": None, "GPU-z": None, "MIG-z": None}
