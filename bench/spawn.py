"""Launch to JupyterLab: our portal (service call -> Celery -> hub -> PortalSpawner) against stock
JupyterHub + DockerSpawner with the same image, and a bare `docker run` as the floor, in one run.

Each figure is the time from the request to JupyterLab's /api answering 200 through
configurable-http-proxy (the floor: directly). Headline: one server at a time, medians of
--runs. Then a burst: --burst people launch at the same moment, on ours and on stock; the
p95 of those launches is compared, and how each scales from one launch to the burst.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.report import Result, percentile
from bench.server import BIN, ROOT, bench_database_url
from bench.spawn_client import BURST_POLL_S, answers, wait

DOCKER = "/usr/bin/docker"
IMAGE = "gpu-portal/notebook:latest"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="launches per contender (default 5)")
    parser.add_argument("--burst", type=int, default=8, help="launches at once in the burst (default 8)")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Stack:
    """Processes started for one contender; stopped together."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir, self.processes = log_dir, []  # type: ignore[var-annotated]

    def start(self, name: str, command: list[str], env: dict[str, str], cwd: Path = ROOT) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        self.processes.append(subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def ours(runs: int, burst: int, tmp: Path) -> tuple[list[float], list[float]]:
    ports = {name: free_port() for name in ("public", "portal", "hub", "proxy_api")}
    public = f"http://127.0.0.1:{ports['public']}"
    env = dict(os.environ)
    env.update(
        PORTAL_DATA_DIR=str(tmp / "portal"),
        DATABASE_URL=bench_database_url(tmp),
        PORTAL_PUBLIC_URL=public,
        PORTAL_INTERNAL_URL=f"http://127.0.0.1:{ports['portal']}",
        PORTAL_HUB_PORT=str(ports["hub"]),
        PORTAL_PROXY_API_PORT=str(ports["proxy_api"]),
        PORTAL_HUB_DATA_DIR=str(tmp / "hub"),
        # The path people's launches take: the portal's own fenced bridge, the hub on its gateway.
        PORTAL_NOTEBOOK_NETWORK=f"gpu-portal-bench-{secrets.token_hex(3)}",
        PORTAL_NOTEBOOK_SUBNET=free_subnet(),
        PORTAL_INSTANCE_ID="bench-spawn",
        PORTAL_GPU_BACKEND="simulated",
        PORTAL_SIMULATED_FLEET="bench: 2xH200:mig",
        PORTAL_CELERY_QUEUE="bench-spawn",
        PORTAL_CACHE_PREFIX="bench-spawn",
        PORTAL_CHANNEL_PREFIX="bench-spawn",
        PORTAL_SECURE_COOKIES="false",
        PORTAL_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    (tmp / "hub").mkdir()
    manage = [str(BIN / "python"), "manage.py"]
    steps = (["migrate", "-v0"], ["collectstatic", "--no-input", "-v0"], ["sync_gpus"], ["register_hub_client"])
    for step in (*steps, ["ensure_user_network"]):
        subprocess.run([*manage, *step], cwd=ROOT, env=env, check=True, capture_output=True)
    subprocess.run([*manage, "ensure_notebook_image"], cwd=ROOT, env=env, check=True, capture_output=True)
    # People who may launch: the 'users' role (the migration made the group).
    names = ["bench", *(f"bench{n}" for n in range(burst))]
    code = (
        "from django.contrib.auth.models import Group, User; "
        f"[User.objects.create_user(name).groups.add(Group.objects.get(name='users')) for name in {names!r}]"
    )
    subprocess.run([*manage, "shell", "-c", code], cwd=ROOT, env=env, check=True, capture_output=True)
    stack = Stack(tmp)
    try:
        stack.start(
            "daphne",
            [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(ports["portal"]), "portal.asgi:application"],
            env,
        )
        stack.start(
            "worker",
            [str(BIN / "celery"), "-A", "portal", "worker", "-Q", "bench-spawn", "-c", "2", "-l", "WARNING"],
            env,
        )
        stack.start(
            "hub", [str(BIN / "jupyterhub"), "-f", str(ROOT / "compose/hub/jupyterhub_config.py")], env, tmp / "hub"
        )
        wait(lambda: answers_any(f"{public}/jupyter/hub/api/"), 60)
        time.sleep(2)  # let the worker connect
        client = [str(BIN / "python"), "-m", "bench.spawn_client", str(runs), public]
        figures = []
        for extra in ([], [str(burst)]):
            result = subprocess.run([*client, *extra], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            figures.append(list(json.loads(result.stdout.strip().splitlines()[-1])))
        return figures[0], figures[1]
    finally:
        stack.stop()
        remove_containers_on(env["PORTAL_NOTEBOOK_NETWORK"])
        subprocess.run([*manage, "ensure_user_network", "--remove"], cwd=ROOT, env=env, check=False)


def free_subnet() -> str:
    """A 10.88.N.0/24 that no Docker network on this engine holds (N from 210 up)."""
    names = subprocess.run([DOCKER, "network", "ls", "-q"], capture_output=True, text=True).stdout.split()
    template = "{{range .IPAM.Config}}{{.Subnet}} {{end}}"
    inspect = [DOCKER, "network", "inspect", "--format", template, *names]
    found = subprocess.run(inspect, capture_output=True, text=True).stdout.split()
    for number in range(210, 250):
        if f"10.88.{number}.0/24" not in found:
            return f"10.88.{number}.0/24"
    raise RuntimeError("no free 10.88.210-249.0/24 for the benchmark's networks")


def remove_containers_on(network: str) -> None:
    ids = subprocess.run([DOCKER, "ps", "-aq", "--filter", f"network={network}"], capture_output=True, text=True)
    for container in ids.stdout.split():
        subprocess.run([DOCKER, "rm", "-f", container], capture_output=True)


def answers_any(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def stock(runs: int, burst: int, tmp: Path) -> tuple[list[float], list[float]]:
    ports = {name: free_port() for name in ("public", "hub", "proxy_api")}
    token = secrets.token_hex(16)
    data = tmp / "stock"
    data.mkdir()
    # DockerSpawner's documented set-up off the host network: a user-defined bridge, the hub on its gateway.
    network, subnet = f"bench-stock-{secrets.token_hex(3)}", free_subnet()
    gateway = str(next(ipaddress.IPv4Network(subnet).hosts()))
    subprocess.run([DOCKER, "network", "create", "--subnet", subnet, network], check=True, capture_output=True)
    env = dict(os.environ)
    env.update(
        BENCH_HUB_DATA=str(data),
        BENCH_PUBLIC_PORT=str(ports["public"]),
        BENCH_HUB_IP=gateway,
        BENCH_HUB_PORT=str(ports["hub"]),
        BENCH_PROXY_API_PORT=str(ports["proxy_api"]),
        BENCH_NETWORK=network,
        BENCH_TOKEN=token,
    )
    public = f"http://127.0.0.1:{ports['public']}"
    stack = Stack(tmp)
    try:
        stack.start("stock-hub", [str(BIN / "jupyterhub"), "-f", str(ROOT / "bench/hub/stock_config.py")], env, data)
        wait(lambda: answers_any(f"{public}/hub/api/"), 60)
        api = f"http://{gateway}:{ports['hub']}/hub/api"
        call(api + "/users/bench", "POST", token)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            call(api + "/users/bench/server", "POST", token)
            wait(lambda: answers(f"{public}/user/bench/api"))
            times.append(time.perf_counter() - started)
            call(api + "/users/bench/server", "DELETE", token)
            wait(lambda: not container_exists("bench-stock-bench"), 60)
        return times, stock_burst(api, public, token, burst)
    finally:
        stack.stop()
        remove_containers_on(network)
        subprocess.run([DOCKER, "network", "rm", network], capture_output=True)


def stock_burst(api: str, public: str, token: str, count: int) -> list[float]:
    """``count`` users' servers requested from the stock hub at the same moment."""
    from concurrent.futures import ThreadPoolExecutor

    users = [f"burst{n}" for n in range(count)]
    for user in users:
        call(f"{api}/users/{user}", "POST", token)
    gate = time.monotonic() + 1.0

    def one(user: str) -> float:
        time.sleep(max(0.0, gate - time.monotonic()))
        started = time.perf_counter()
        call(f"{api}/users/{user}/server", "POST", token)
        wait(lambda: answers(f"{public}/user/{user}/api"), every=BURST_POLL_S)
        return time.perf_counter() - started

    with ThreadPoolExecutor(count) as pool:
        times = list(pool.map(one, users))
    for user in users:
        call(f"{api}/users/{user}/server", "DELETE", token)
    for user in users:
        wait(lambda user=user: not container_exists(f"bench-stock-{user}"), 90)
    return times


def call(url: str, method: str, token: str) -> None:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"}, data=b"{}")
    with urllib.request.urlopen(request, timeout=30):
        return


def container_exists(name: str) -> bool:
    out = subprocess.run([DOCKER, "ps", "-aq", "--filter", f"name=^{name}$"], capture_output=True, text=True)
    return bool(out.stdout.strip())


def floor(runs: int, bridged: bool = False) -> list[float]:
    """A bare `docker run` of the image with `jupyter lab` until /api answers: on the host's network, or on a
    fresh bridge (what a network namespace and veth of its own cost every launch)."""
    network = f"bench-floor-{secrets.token_hex(3)}" if bridged else "host"
    if bridged:
        subprocess.run(
            [DOCKER, "network", "create", "--subnet", free_subnet(), network], check=True, capture_output=True
        )
    times = []
    try:
        for number in range(runs):
            times.append(one_floor(number, network))
    finally:
        if bridged:
            subprocess.run([DOCKER, "network", "rm", network], capture_output=True)
    return times


def one_floor(number: int, network: str) -> float:
    port, name = free_port(), f"bench-floor-{number}"
    ip = "127.0.0.1" if network == "host" else "0.0.0.0"  # noqa: S104 (inside the container's own namespace)
    command = [DOCKER, "run", "-d", "--rm", "--name", name, "--network", network, IMAGE, "jupyter", "lab"]
    command += ["--ip", ip, f"--port={port}", "--no-browser", "--ServerApp.token=", "--ServerApp.password="]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    address = "127.0.0.1"
    if network != "host":
        template = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        address = subprocess.run(
            [DOCKER, "inspect", "-f", template, name], capture_output=True, text=True
        ).stdout.strip()
    wait(lambda: answers(f"http://{address}:{port}/api"))
    elapsed = time.perf_counter() - started
    subprocess.run([DOCKER, "rm", "-f", name], capture_output=True)
    return elapsed


def run(args: argparse.Namespace) -> Result:
    subprocess.run([str(ROOT / "compose/bin/ensure-docker")], check=True, capture_output=True)
    subprocess.run([str(ROOT / "compose/bin/ensure-proxy")], check=True)
    subprocess.run([str(ROOT / "compose/bin/build-notebook-image")], check=True)
    with tempfile.TemporaryDirectory(prefix="bench-spawn-") as name:
        tmp = Path(name)
        ours_runs, ours_burst = ours(args.runs, args.burst, tmp)
        stock_runs, stock_burst_runs = stock(args.runs, args.burst, tmp)
        figures = {
            "ours": ours_runs,
            "stock": stock_runs,
            "floor": floor(args.runs),
            "floor_bridged": floor(args.runs, bridged=True),
        }
    medians = {key: round(statistics.median(values), 3) for key, values in figures.items()}
    bursts = {"ours": ours_burst, "stock": stock_burst_runs}
    p95 = {key: round(percentile(values, 95), 3) for key, values in bursts.items()}
    details = {
        "medians_s": medians,
        "runs_s": {key: [round(v, 3) for v in values] for key, values in figures.items()},
        "ours_vs_floor": round(medians["ours"] / medians["floor"], 3),
        "ours_vs_bridged_floor": round(medians["ours"] / medians["floor_bridged"], 3),
        f"burst_{args.burst}": {
            "p95_s": p95,
            "medians_s": {key: round(statistics.median(values), 3) for key, values in bursts.items()},
            "runs_s": {key: sorted(round(v, 3) for v in values) for key, values in bursts.items()},
            "p95_ratio_ours_over_stock": round(p95["ours"] / p95["stock"], 3),
            "goal": "ratio <= 1.0",
            # how each slows from one launch alone to the burst (median of the burst over median alone)
            "scaling_1_to_burst": {
                key: round(statistics.median(bursts[key]) / medians[key], 2) for key in ("ours", "stock")
            },
        },
    }
    print(json.dumps(details, indent=2))
    result = Result(
        name="spawn",
        metric="launch_to_ready_median_s",
        value=medians["ours"],
        baseline_name="stock JupyterHub + DockerSpawner, same image and proxy",
        baseline=medians["stock"],
        better="lower",
        goal="ratio <= 0.8",
        goal_ratio=0.8,
        unit="s",
        details=details,
    )
    result.write()
    return result
