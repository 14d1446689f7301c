"""supervisord event listener: start a program that went FATAL again after a pause.

supervisord gives up on a program that keeps dying right after it starts (FATAL, "too many start
retries too quickly") and never tries it again by itself. That is what a program does while Redis,
the database or the proxy is away, so this listener starts it again after PAUSE seconds, for as long
as it takes. Usage: revive.py PAUSE_SECONDS (see compose/supervisor/supervisord.conf).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

from supervisor import childutils


def say(text: str) -> None:
    # stdout belongs to the event protocol; stderr goes to <data dir>/logs/revive.log.
    print(f"revive: {text}", file=sys.stderr, flush=True)


def start(name: str) -> None:
    rpc: Any = childutils.getRPCInterface(os.environ)
    try:
        rpc.supervisor.startProcess(name, False)
        say(f"started {name} again")
    except Exception as error:  # already running, shutting down, or the start failed: all said in the log
        say(f"could not start {name}: {error}")


def main(pause_s: float) -> None:
    while True:
        headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
        if headers["eventname"] == "PROCESS_STATE_FATAL":
            fields = childutils.get_headers(payload)
            name = f"{fields['groupname']}:{fields['processname']}"
            say(f"{name} kept failing at start; trying again in {pause_s:g} s")
            timer = threading.Timer(pause_s, start, args=(name,))
            timer.daemon = True
            timer.start()
        childutils.listener.ok(sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with contextlib.suppress(KeyboardInterrupt):  # stopsignal=INT: a quiet stop
        main(float(sys.argv[1]))
