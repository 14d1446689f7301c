"""Run as its own process by the parallel-allocation test: fire requests at a set moment.

python -m tests.helpers.allocate_worker START_AT USER_ID PROFILE [PROFILE ...]
prints one JSON line: {"slices": [ids], "refused": [codes]}.
"""

from __future__ import annotations

import json
import os
import sys
import time

import django


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
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


if __name__ == "__main__":
    main(sys.argv[1:])
