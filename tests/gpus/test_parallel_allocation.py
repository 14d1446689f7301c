"""Parallel requests from several processes never overlap, overfill or break a limit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from sessions.gpus.models import Gpu, Slice, SliceQuota
from sessions.gpus.orders import recount
from tests.factories import make_user
from tests.gpus import checker
from tests.gpus.conftest import use_fleet
from tests.helpers.processes import ROOT, child_env

pytestmark = pytest.mark.django_db(transaction=True)
FLEET = "par: 2xH200:mig"
MIX = ["1g.18gb", "2g.35gb", "1g.35gb", "3g.71gb", "1g.18gb", "4g.71gb", "1g.18gb", "2g.35gb"]


def fire(users: list[User], per_process: list[list[str]]) -> list[dict[str, list[object]]]:
    start_at = time.time() + 4
    env = child_env(PORTAL_GPU_BACKEND="simulated", PORTAL_SIMULATED_FLEET=FLEET)
    command = [sys.executable, "-m", "tests.helpers.allocate_worker", str(start_at)]
    processes = [
        subprocess.Popen([*command, str(user.pk), *profiles], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for user, profiles in zip(users, per_process, strict=True)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes)
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


def test_parallel_requests_never_overlap_or_overfill(settings) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, FLEET)
    users = [make_user(f"racer{n}", ["users"]) for n in range(4)]
    for user in users:
        SliceQuota.objects.create(user=user, max_slices=50)
    results = fire(users, [MIX] * 4)
    granted = sum(len(result["slices"]) for result in results)
    assert granted == Slice.objects.filter(released_at__isnull=True).count()
    assert granted >= 4, "the fleet should serve at least a few of these"
    assert all(code == "no_capacity" for result in results for code in result["refused"])
    assert checker.problems() == []
    for gpu in Gpu.objects.all():
        assert gpu.layout_key == gpu.layout().key
        recorded = (gpu.layout(), gpu.active_slices)
        recount(gpu)
        assert (gpu.layout(), gpu.active_slices) == recorded, "bookkeeping drifted from the instances"


def test_parallel_requests_of_one_user_respect_the_limit(settings) -> None:  # type: ignore[no-untyped-def]
    use_fleet(settings, FLEET)
    user = make_user("greedy", ["users"])
    SliceQuota.objects.create(user=user, max_slices=3)
    results = fire([user] * 4, [["1g.18gb", "1g.18gb"]] * 4)
    assert Slice.objects.filter(owner=user, released_at__isnull=True).count() == 3
    assert sorted(str(code) for result in results for code in result["refused"]) == ["quota"] * 5


ROUNDS = 10


def rounds_at_once(
    fleet: str, users: list[User], kind: str, profile: str = "", *, barrier: Path
) -> list[dict[str, list[object]]]:
    """Every user's process asks at the same moment, ROUNDS times; all give their slices back between rounds."""
    start_at = time.time() + 3  # the processes start and connect first
    env = child_env(PORTAL_GPU_BACKEND="simulated", PORTAL_SIMULATED_FLEET=fleet)
    command = [sys.executable, "-m", "tests.helpers.allocate_worker", "--rounds", str(ROUNDS), str(barrier)]
    processes = [
        subprocess.Popen(
            [*command, str(len(users)), str(start_at), str(user.pk), kind, *([profile] if profile else [])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for user in users
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes)
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


@pytest.mark.parametrize(
    ("fleet", "kind", "profile", "asking", "room"),
    [
        ("par: 1xH200:mig", "mig", "1g.18gb", 4, 4),  # room for 7: all four
        ("par: 1xH200:mig", "mig", "1g.18gb", 9, 7),  # nine at once for seven
        ("par: 2xH200:mig", "mig", "1g.18gb", 8, 8),  # room for 14 on two GPUs: all eight
        ("par: 2xH200:mig", "mig", "2g.35gb", 8, 6),  # three 2g per H200
        ("par: 2xL4:whole", "whole", "", 4, 2),
        ("par: 1xA30:shared=3", "shared", "", 3, 3),
        ("par: 1xA30:shared=3", "shared", "", 5, 3),
    ],
)
def test_simultaneous_requests_get_exactly_the_room_there_is(  # type: ignore[no-untyped-def]
    settings, tmp_path: Path, fleet: str, kind: str, profile: str, asking: int, room: int
) -> None:
    """N requests at the same moment against room for C get exactly min(N, C), every round."""
    use_fleet(settings, fleet)
    users = [make_user(f"asker{n}", ["users"]) for n in range(asking)]
    results = rounds_at_once(fleet, users, kind, profile, barrier=tmp_path)
    per_round = [sum(bool(result["granted"][n]) for result in results) for n in range(ROUNDS)]
    assert per_round == [min(asking, room)] * ROUNDS, per_round
    reasons = {str(reason) for result in results for reason in result["refused"]}
    if profile:  # a refusal never says the refused profile is free
        assert not any(f"{profile} ×" in reason for reason in reasons), reasons
    assert not Slice.objects.filter(released_at__isnull=True).exists()
    assert checker.problems() == []


def test_simultaneous_requests_on_a_static_layout_get_exactly_its_free_instances(settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from sessions.gpus.fleet import set_layout, set_policy

    fleet = "par: 1xH200:mig"
    [gpu] = use_fleet(settings, fleet)
    set_policy(gpu.pk, Gpu.Policy.STATIC)
    set_layout(gpu.pk, [("1g.18gb", start) for start in range(7)])
    users = [make_user(f"static{n}", ["users"]) for n in range(9)]
    results = rounds_at_once(fleet, users, "mig", "1g.18gb", barrier=tmp_path)
    per_round = [sum(bool(result["granted"][n]) for result in results) for n in range(ROUNDS)]
    assert per_round == [7] * ROUNDS, per_round
    reasons = {str(reason) for result in results for reason in result["refused"]}
    assert reasons and not any("1g.18gb ×" in reason for reason in reasons), reasons
    assert not Slice.objects.filter(released_at__isnull=True).exists()
    assert checker.problems() == []
