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
import time

import aiohttp
import websockets

SAMPLED_AT = re.compile(rb'"t":([0-9.]+)')


def sampled_at(text: str | bytes) -> float:
    data = text.encode() if isinstance(text, str) else text
    found = SAMPLED_AT.search(data[:200])  # the frame's own moment sits near its start: no full parse
    return float(found[1]) if found else 0.0


async def socket_client(
    url: str,
    cookie: str,
    ready: asyncio.Event,
    start: asyncio.Event,
    until: list[float],
    delays: list[float],
    failures: list[str],
    connected: list[int],
    total: int,
) -> None:
    headers = {"Cookie": cookie, "Origin": "http://127.0.0.1:8000"}
    try:
        async with websockets.connect(
            url, additional_headers=headers, open_timeout=60, max_size=None, compression=None
        ) as socket:
            connected[0] += 1
            if connected[0] == total:
                ready.set()
            await start.wait()
            while time.monotonic() < until[0]:
                try:
                    text = await asyncio.wait_for(socket.recv(), timeout=max(0.1, until[0] - time.monotonic()))
                except TimeoutError:
                    break
                taken = sampled_at(text)
                if taken >= until[1]:  # the frame a socket gets on connecting is older: not a delivery delay
                    delays.append(time.time() - taken)
    except Exception as error:  # counted and reported, never hidden
        failures.append(type(error).__name__)
        connected[0] += 1
        if connected[0] == total:
            ready.set()


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
    until, connected = [0.0], [0]
    delays: list[float] = []
    failures: list[str] = []
    tasks = []
    for _ in range(args.clients):
        tasks.append(
            asyncio.create_task(
                socket_client(args.url, args.cookie, ready, start, until, delays, failures, connected, args.clients)
            )
        )
        await asyncio.sleep(args.stagger)
    await asyncio.wait_for(ready.wait(), timeout=120)
    until[0] = time.monotonic() + args.duration
    until.append(time.time())
    start.set()
    await asyncio.gather(*tasks)
    return {"delays": delays, "failures": len(failures), "failure_kinds": sorted(set(failures))[:5]}


async def run_polling(args: argparse.Namespace) -> dict[str, object]:
    ages: list[float] = []
    times: list[float] = []
    failures: list[str] = []
    connector = aiohttp.TCPConnector(limit=args.clients)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, headers={"Cookie": args.cookie}, timeout=timeout) as session:
        until = time.monotonic() + args.duration
        await asyncio.gather(
            *(poll_client(session, args.url, until, ages, times, failures) for _ in range(args.clients))
        )
    return {"ages": ages, "request_times": times, "failures": len(failures), "failure_kinds": sorted(set(failures))[:5]}


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
