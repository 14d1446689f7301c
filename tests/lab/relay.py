"""The lab's way back to the portal: listens on the switch's lab address (inside the switch's namespace) and
carries each connection to the same service on this machine's 127.0.0.1 (PostgreSQL, Redis, the portal), so
the agents and render workers inside the lab's hosts reach the portal as a real host would, over its link:
cut the link and they lose it.

It listens on the switch namespace's own 127.0.0.1 too, for the processes that run there (the hub, which
reaches the portal as it does on one machine). The listening sockets are made inside the switch's namespace
(``setns``, for this thread only, before any other thread exists) and the outgoing ones in this machine's,
which the process then returns to. Nothing of the lab is reachable from this machine's side, and nothing
leaves the lab but through these ports.

``--into PORT[:TO]`` goes the other way, for what people and the portal reach inside the lab (the hub's
proxy, which listens on the switch namespace's own 127.0.0.1): it listens on this machine's 127.0.0.1:PORT
and connects to 127.0.0.1:TO inside the switch's namespace (a socket made there, the thread back at once).

``python -m tests.lab.relay NETNS ADDRESS PORT[:TO] ... [--into PORT[:TO] ...] --pidfile FILE``
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

CLONE_NEWNET = 0x40000000


def setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


def in_namespace(netns: str, make: Callable[[], socket.socket]) -> socket.socket:
    """A socket made inside ``netns`` (it stays there), this thread back in its own namespace at once."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        setns(there)
        return make()
    finally:
        setns(home)
        os.close(home)
        os.close(there)


def listener(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(256)
    sock.setblocking(False)
    return sock


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def forward(to: int, netns: str | None = None) -> Handler:
    """Carry a connection to 127.0.0.1:``to``: this machine's, or ``netns``'s."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if netns is None:
                far_reader, far_writer = await asyncio.open_connection("127.0.0.1", to)
            else:
                sock = in_namespace(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", to))
                far_reader, far_writer = await asyncio.open_connection(sock=sock)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, far_writer), pipe(far_reader, writer))

    return handle


async def serve(routes: list[tuple[socket.socket, Handler]]) -> None:
    servers = [await asyncio.start_server(handler, sock=sock) for sock, handler in routes]
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
    parser.add_argument("ports", nargs="*", help="PORT or PORT:TO (listen on PORT, carry to 127.0.0.1:TO)")
    parser.add_argument("--into", action="append", default=[], help="PORT[:TO] from this machine into the lab")
    parser.add_argument("--pidfile", type=Path, required=True)
    args = parser.parse_args()
    routes = [
        (in_namespace(args.netns, partial(listener, address, listen)), forward(to))
        for listen, to in map(pair, args.ports)
        for address in (args.address, "127.0.0.1")  # the hosts, over their links; the switch's own processes
    ]
    routes += [(listener("127.0.0.1", listen), forward(to, args.netns)) for listen, to in map(pair, args.into)]
    args.pidfile.write_text(str(os.getpid()))
    asyncio.run(serve(routes))


def pair(text: str) -> tuple[int, int]:
    return int(text.split(":")[0]), int(text.split(":")[-1])


if __name__ == "__main__":
    main()
