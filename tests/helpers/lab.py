"""A stand-in for the world outside the host, made of a network namespace of our own.

One namespace joined to the host by a veth pair holds two addresses that exist
nowhere else: a private one (10.77.N.2, like a LAN host or a metadata service)
and one from a documentation range standing for the internet (203.0.113.N).
The host routes both into the namespace only, checked before anything is sent,
so probes from user containers never leave the machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

from tests.helpers.processes import free_port


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


SERVE = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(b"lab")
    connection.close()
"""


@dataclass
class Lab:
    tag: str
    number: int
    port: int
    server: subprocess.Popen[str] | None = None

    @property
    def namespace(self) -> str:
        return f"gpup-lab-{self.tag}"

    @property
    def host_end(self) -> str:
        return f"gpl{self.tag[:6]}h"

    @property
    def lab_end(self) -> str:
        return f"gpl{self.tag[:6]}n"

    @property
    def private_address(self) -> str:
        return f"10.77.{self.number}.2"

    @property
    def public_address(self) -> str:
        return f"203.0.113.{self.number}"

    def start(self) -> Lab:
        ip("netns", "add", self.namespace)
        ip("link", "add", self.host_end, "type", "veth", "peer", "name", self.lab_end)
        ip("link", "set", self.lab_end, "netns", self.namespace)
        ip("addr", "add", f"10.77.{self.number}.1/24", "dev", self.host_end)
        ip("link", "set", self.host_end, "up")
        ip("-n", self.namespace, "addr", "add", f"{self.private_address}/24", "dev", self.lab_end)
        ip("-n", self.namespace, "addr", "add", f"{self.public_address}/32", "dev", self.lab_end)
        ip("-n", self.namespace, "link", "set", self.lab_end, "up")
        ip("-n", self.namespace, "link", "set", "lo", "up")
        ip("route", "add", f"{self.public_address}/32", "via", self.private_address, "dev", self.host_end)
        for address in (self.private_address, self.public_address):
            route = ip("route", "get", address).stdout
            if f"dev {self.host_end}" not in route:
                self.stop()
                raise RuntimeError(f"{address} would not go into the lab namespace ({route.strip()}); not probing")
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, sys.executable, "-c", SERVE, str(self.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.server.stdout is not None and self.server.stdout.readline().strip() == "ready"
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=10)
        ip("route", "del", f"{self.public_address}/32", check=False)
        ip("link", "del", self.host_end, check=False)
        ip("netns", "del", self.namespace, check=False)
        time.sleep(0.1)


def start_lab(tag: str) -> Lab:
    number = 100 + int(tag, 16) % 100
    return Lab(tag=tag, number=number, port=free_port()).start()
