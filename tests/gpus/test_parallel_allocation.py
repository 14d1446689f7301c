"""Parallel requests from several processes never overlap, overfill or break a limit."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from django.contrib.auth.models import User

from sessions.gpus.fleet import recount
from sessions.gpus.models import Gpu, Slice, SliceQuota
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
