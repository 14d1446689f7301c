"""The lab's way back to the portal: listens on the switch's lab address (inside the switch's namespace) and
carries each connection to the same service on this machine's 127.0.0.1 (PostgreSQL, Redis, the portal), so
the agents and render workers inside the lab's hosts reach the portal as a real host would, over its link:
cut the link and they lose it.

The listening sockets are made inside the switch's namespace (``setns``, for this thread only, before any
other thread exists) and the outgoing ones in this machine's, which the process then returns to. Nothing of
the lab is reachable from this machine's side, and nothing leaves the lab but through these ports.

``python -m tests.lab.relay NETNS ADDRESS PORT[:TO] ... --pidfile FILE``
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

CLONE_NEWNET = 0x40000000


def setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


def listeners(netns: str, address: str, ports: list[int]) -> list[socket.socket]:
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        setns(there)
        made = []
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(256)
            sock.setblocking(False)
            made.append(sock)
        return made
    finally:
        setns(home)
        os.close(home)
        os.close(there)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def forward(to: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            far_reader, far_writer = await asyncio.open_connection("127.0.0.1", to)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, far_writer), pipe(far_reader, writer))

    return handle


async def serve(socks: list[socket.socket], targets: list[int]) -> None:
    servers = [await asyncio.start_server(forward(to), sock=sock) for sock, to in zip(socks, targets, strict=True)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.lab.relay")
    parser.add_argument("netns")
    parser.add_argument("address")
    parser.add_argument("ports", nargs="+", help="PORT or PORT:TO (listen on PORT, carry to 127.0.0.1:TO)")
    parser.add_argument("--pidfile", type=Path, required=True)
    args = parser.parse_args()
    pairs = [(int(p.split(":")[0]), int(p.split(":")[-1])) for p in args.ports]
    socks = listeners(args.netns, args.address, [listen for listen, _ in pairs])
    args.pidfile.write_text(str(os.getpid()))
    asyncio.run(serve(socks, [to for _, to in pairs]))


if __name__ == "__main__":
    main()
