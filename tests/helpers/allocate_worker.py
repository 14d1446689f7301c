"""Run as its own process by the parallel-allocation tests: fire requests at set moments.

python -m tests.helpers.allocate_worker START_AT USER_ID PROFILE [PROFILE ...]
    prints one JSON line: {"slices": [ids], "refused": [codes]}.
python -m tests.helpers.allocate_worker --rounds ROUNDS BARRIER PARTIES START_AT USER_ID KIND [PROFILE]
    in each round asks for one slice, and gives it back once every one of the PARTIES processes has
    had its answer (a barrier of files in the folder BARRIER), so a round's answers never depend on
    how fast each process happens to be; the first round starts at START_AT;
    prints one JSON line: {"granted": [true/false per round], "refused": [reasons]}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import django


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    if argv[0] == "--rounds":
        barrier = Barrier(Path(argv[2]), int(argv[3]))
        rounds(int(argv[1]), barrier, float(argv[4]), int(argv[5]), argv[6], argv[7] if len(argv) > 7 else "")
        return
    from django.contrib.auth.models import User

    from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate

    start_at, user_id, profiles = float(argv[0]), int(argv[1]), argv[2:]
    owner = User.objects.get(pk=user_id)
    time.sleep(max(0.0, start_at - time.time()))
    slices, refused = [], []
    for profile in profiles:
        try:
            slices.append(allocate(owner, SliceRequest(kind="mig", profile=profile)).pk)
        except AllocationRefused as error:
            refused.append(error.code)
    print(json.dumps({"slices": slices, "refused": refused}))


class Barrier:
    """Processes meet at named points: each writes a file, then waits until all parties have."""

    def __init__(self, folder: Path, parties: int) -> None:
        self.folder, self.parties = folder, parties

    def meet(self, point: str, timeout: float = 60.0) -> None:
        place = self.folder / point
        place.mkdir(exist_ok=True)
        (place / str(os.getpid())).touch()
        give_up = time.monotonic() + timeout
        while sum(1 for _ in place.iterdir()) < self.parties:
            if time.monotonic() > give_up:
                raise TimeoutError(f"only {sum(1 for _ in place.iterdir())} of {self.parties} reached {point}")
            time.sleep(0.005)


def rounds(count: int, barrier: Barrier, start_at: float, user_id: int, kind: str, profile: str) -> None:
    from django.contrib.auth.models import User
    from django.db import connection

    from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate, release

    owner = User.objects.get(pk=user_id)
    connection.ensure_connection()  # each request its own connection, ready before the moment
    granted, refused = [], []
    time.sleep(max(0.0, start_at - time.time()))
    for number in range(count):
        barrier.meet(f"ask-{number}")  # everyone asks at once
        try:
            taken = allocate(owner, SliceRequest(kind=kind, profile=profile))
        except AllocationRefused as error:
            taken = None
            refused.append(error.reason)
        granted.append(taken is not None)
        barrier.meet(f"answered-{number}")  # nobody gives back before everyone has an answer
        if taken is not None:
            release(taken.pk)
    print(json.dumps({"granted": granted, "refused": refused}))


if __name__ == "__main__":
    main(sys.argv[1:])
