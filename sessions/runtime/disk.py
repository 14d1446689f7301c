"""What Docker volumes hold on disk, measured by the portal itself: a short container of ours mounts them
read-only, with no network, and counts them as the output watchdog counts a folder (``watchdogs.folder_bytes``):
without following links, each entry at least 4 KiB, a sparse file at its full length.

Nothing the volume holds is trusted or run: the counting is our Python, given on the command line (``-I -S``:
nothing imported from the volume or the environment), and what comes back is one number per volume, read
strictly. It runs as root with DAC_READ_SEARCH alone, so a folder its owner made unreadable is counted too
(nobody hides files from their quota), and needs no access to the engine's own folders, so a portal that is not
root, or an engine on another host, measures the same way. The render image has the Python it needs.
"""

from __future__ import annotations

import logging
import re

from sessions.runtime.docker import DockerRuntime, RuntimeError_
from sessions.runtime.render import RENDER_IMAGE

log = logging.getLogger(__name__)
AT_ONCE = 32  # volumes one measuring container mounts
WALL_S = 600  # how long one may count before it is stopped (its volumes keep their last figures)
ANSWER = re.compile(r"(\d+) (\d+)")
# The count, as watchdogs.folder_bytes makes it (an unreadable folder, which DAC_READ_SEARCH should never
# leave, is counted as what could be read of it).
COUNT = """
import os, sys
def size(top):
    total, pending = 0, [top]
    while pending:
        try:
            with os.scandir(pending.pop()) as found:
                entries = list(found)
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += max(4096, info.st_size, info.st_blocks * 512)
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return total
for number, top in enumerate(sys.argv[1:]):
    print(number, size(top), flush=True)
"""


def volume_bytes(runtime: DockerRuntime, names: list[str]) -> dict[str, int]:
    """What each of these volumes holds. A batch whose count fails or runs too long is logged and left out (its
    volumes keep their last figures); RuntimeError_ if every batch failed (the engine does not answer, say)."""
    measured: dict[str, int] = {}
    failures: list[RuntimeError_] = []
    for start in range(0, len(names), AT_ONCE):
        batch = names[start : start + AT_ONCE]
        try:
            measured.update(_count(runtime, batch))
        except RuntimeError_ as error:
            log.warning("could not measure volumes %s: %s", ", ".join(batch), error)
            failures.append(error)
    if failures and not measured:
        raise failures[0]
    return measured


def _count(runtime: DockerRuntime, batch: list[str]) -> dict[str, int]:
    mounts = {name: {"bind": f"/v/{number}", "mode": "ro"} for number, name in enumerate(batch)}
    command = ["python3", "-I", "-S", "-c", COUNT, *(mount["bind"] for mount in mounts.values())]
    status, printed = runtime.run_chore(
        RENDER_IMAGE, command, "0:0", mounts, capabilities=("DAC_READ_SEARCH",), timeout=WALL_S
    )
    if status != 0:
        raise RuntimeError_(f"counting {len(batch)} volumes ended with status {status}: {printed[-500:]}")
    found: dict[str, int] = {}
    for line in printed.splitlines():
        if (answer := ANSWER.fullmatch(line.strip())) and int(answer[1]) < len(batch):
            found[batch[int(answer[1])]] = int(answer[2])
    return found
