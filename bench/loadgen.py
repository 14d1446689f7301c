"""HTTP load generator, run as its own process: N clients loop on one URL for a while.

python -m bench.loadgen URL --clients 50 --duration 20 [--cookie C]
prints {"latencies": [...seconds], "errors": n} as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp


async def client_loop(
    session: aiohttp.ClientSession, url: str, until: float, out: list[float], errors: list[str]
) -> None:
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            async with session.get(url, allow_redirects=False) as response:
                await response.read()
                if response.status != 200:
                    errors.append(f"HTTP {response.status}")
                    continue
        except (aiohttp.ClientError, TimeoutError) as error:
            errors.append(type(error).__name__)
            continue
        out.append(time.perf_counter() - started)


async def load(url: str, clients: int, duration: float, cookie: str) -> dict[str, object]:
    headers = {"Cookie": cookie} if cookie else {}
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    latencies: list[float] = []
    errors: list[str] = []
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:
        until = time.monotonic() + duration
        await asyncio.gather(*(client_loop(session, url, until, latencies, errors) for _ in range(clients)))
    return {"latencies": latencies, "errors": len(errors), "error_kinds": sorted(set(errors))[:5]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--cookie", default="")
    args = parser.parse_args()
    if not args.url.startswith("http://127.0.0.1:"):
        parser.error("the load generator only targets http://127.0.0.1")
    print(json.dumps(asyncio.run(load(args.url, args.clients, args.duration, args.cookie))))


if __name__ == "__main__":
    main()
