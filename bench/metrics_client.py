"""Client process of the metrics benchmark: many websocket (or polling) clients in one process.

python -m bench.metrics_client ws://127.0.0.1:PORT/ws/metrics/fleet/ --clients 250 --duration 20 --cookie C
python -m bench.metrics_client http://127.0.0.1:PORT/sessions/fleet/live.json --poll ...

Waits until every client is connected (or has polled once), then measures for
``duration`` seconds and prints one JSON line: for websockets the delay from
each frame's sample moment to its arrival; for polling the age of the newest
figures in each answer and each request's time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections import Counter

import aiohttp
import websockets

SAMPLED_AT = re.compile(rb'"t":([0-9.]+)')


def sampled_at(text: str | bytes) -> float:
    data = text.encode() if isinstance(text, str) else text
    found = SAMPLED_AT.search(data[:200])  # the frame's own moment sits near its start: no full parse
    return float(found[1]) if found else 0.0


def failure_kind(error: BaseException) -> str:
    """A short, countable name for why a client failed: the exception and its HTTP status or close code."""
    kind = type(error).__name__
    response = getattr(error, "response", None)
    if response is not None and getattr(response, "status_code", None):
        return f"{kind} HTTP {response.status_code}"
    received = getattr(error, "rcvd", None)
    if received is not None:
        return f"{kind} close {received.code}"
    return kind


async def socket_client(
    url: str,
    cookie: str,
    ready: asyncio.Event,
    start: asyncio.Event,
    until: list[float],
    state: dict[str, object],
    total: int,
) -> None:
    """One browser tab: connect, wait for the measured window, then take frames until it ends.

    Every frame sampled inside the window is counted for this client, so missing frames are known;
    a client that cannot connect, or whose socket closes early, is a failure with its kind.
    """
    headers = {"Cookie": cookie, "Origin": "http://127.0.0.1:8000"}
    delays: list[float] = state["delays"]  # type: ignore[assignment]
    seen: set[float] = state["seen"]  # type: ignore[assignment]
    by_frame: dict[float, list[float]] = state["by_frame"]  # type: ignore[assignment]
    counts: list[int] = state["counts"]  # type: ignore[assignment]
    failures: list[str] = state["failures"]  # type: ignore[assignment]
    connected: list[int] = state["connected"]  # type: ignore[assignment]
    got: set[float] = set()
    stage = "connect"
    try:
        async with websockets.connect(
            url, additional_headers=headers, open_timeout=60, max_size=None, compression=None
        ) as socket:
            stage = "stream"
            connected[0] += 1
            if connected[0] + len(failures) == total:
                ready.set()
            await start.wait()
            while time.monotonic() < until[0]:
                try:
                    text = await asyncio.wait_for(socket.recv(), timeout=max(0.1, until[0] - time.monotonic()))
                except TimeoutError:
                    break
                taken = sampled_at(text)
                if until[1] <= taken <= until[2]:  # the frame a socket gets on connecting is older: not counted
                    delay = time.time() - taken
                    delays.append(delay)
                    by_frame.setdefault(taken, []).append(delay)
                    seen.add(taken)
                    if taken in got:
                        state["duplicates"] = int(state["duplicates"]) + 1  # type: ignore[call-overload]
                    got.add(taken)
    except Exception as error:  # counted and reported, never hidden
        failures.append(f"{stage}: {failure_kind(error)}")
        if stage == "connect" and connected[0] + len(failures) == total:
            ready.set()
    counts.append(len(got))


async def poll_client(
    session: aiohttp.ClientSession, url: str, until: float, ages: list[float], times: list[float], failures: list[str]
) -> None:
    await asyncio.sleep(random.uniform(0, 1))  # spread the clients over the second
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            async with session.get(url) as response:
                body = await response.read()
                if response.status != 200:
                    failures.append(f"HTTP {response.status}")
                else:
                    ages.append(time.time() - sampled_at(body[body.find(b"{", 1) :]))
        except (aiohttp.ClientError, TimeoutError) as error:
            failures.append(type(error).__name__)
        times.append(time.monotonic() - began)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))


async def run_sockets(args: argparse.Namespace) -> dict[str, object]:
    ready, start = asyncio.Event(), asyncio.Event()
    until: list[float] = [0.0]
    state: dict[str, object] = {
        "delays": [],
        "seen": set(),
        "counts": [],
        "failures": [],
        "connected": [0],
        "duplicates": 0,
        "by_frame": {},
    }
    tasks = []
    began = time.monotonic()
    for _ in range(args.clients):
        tasks.append(
            asyncio.create_task(socket_client(args.url, args.cookie, ready, start, until, state, args.clients))
        )
        await asyncio.sleep(args.stagger)
    await asyncio.wait_for(ready.wait(), timeout=120)
    connect_s = time.monotonic() - began
    await go_signal()
    # Frames sampled from a second after the go (the server has joined every socket to its group)
    # until a second before the end (so each has time to arrive).
    await asyncio.sleep(1.0)
    until[0] = time.monotonic() + args.duration
    until.extend([time.time(), time.time() + args.duration - 1.0])
    start.set()
    await asyncio.gather(*tasks)
    failures: list[str] = state["failures"]  # type: ignore[assignment]
    return {
        "delays": state["delays"],
        "seen": sorted(state["seen"]),  # type: ignore[call-overload]
        "counts": state["counts"],
        "duplicates": state["duplicates"],
        # per frame (by its sample time): the slowest arrival in this process, to tell a stall of the
        # server (every client late on one frame) from clients that fall behind
        "frame_max": {str(t): max(d) for t, d in state["by_frame"].items()},  # type: ignore[attr-defined]
        "connected": state["connected"][0],  # type: ignore[index]
        "seconds_to_connect_all": round(connect_s, 2),
        "failures": len(failures),
        "failure_kinds": dict(Counter(failures)),
    }


async def go_signal() -> None:
    """Say all clients are connected, then wait for the bench to start every client process at once."""
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def run_polling(args: argparse.Namespace) -> dict[str, object]:
    ages: list[float] = []
    times: list[float] = []
    failures: list[str] = []
    connector = aiohttp.TCPConnector(limit=args.clients)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, headers={"Cookie": args.cookie}, timeout=timeout) as session:
        await go_signal()
        until = time.monotonic() + args.duration
        await asyncio.gather(
            *(poll_client(session, args.url, until, ages, times, failures) for _ in range(args.clients))
        )
    return {"ages": ages, "request_times": times, "failures": len(failures), "failure_kinds": dict(Counter(failures))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--cookie", default="")
    parser.add_argument("--poll", action="store_true")
    parser.add_argument("--stagger", type=float, default=0.01, help="seconds between opening sockets")
    args = parser.parse_args()
    if not args.url.startswith(("ws://127.0.0.1:", "http://127.0.0.1:")):
        parser.error("the clients only connect to 127.0.0.1")
    print(json.dumps(asyncio.run(run_polling(args) if args.poll else run_sockets(args))))


if __name__ == "__main__":
    main()
