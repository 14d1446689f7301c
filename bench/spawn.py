"""Launch to JupyterLab: our portal (service call -> Celery -> hub -> PortalSpawner) against stock
JupyterHub + DockerSpawner with the same image, and a bare `docker run` as the floor, in one run.

Each figure is the time from the request to JupyterLab's /api answering 200 through
configurable-http-proxy (the floor: directly). Headline: one server at a time, medians of
--runs. Then a burst: --burst people launch at the same moment, on ours and on stock; the
p95 of those launches is compared, and how each scales from one launch to the burst.

Whatever it starts goes again when it ends, on failure too: its processes (each in a process group
of its own, so a proxy the hub launched goes with the hub), every container and network it made
(labelled gpu-portal.bench=<run>, or, for the portal's own, its instance label), the portal's work
volumes and its database. A step that fails says what it wrote to stderr; the processes' logs are
artifacts/logs/bench-spawn-*.log.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.report import Result, percentile, record
from bench.server import (
    BIN,
    LOGS,
    ROOT,
    BenchFailed,
    bench_database_url,
    drop_bench_database,
    run_checked,
    stop_process,
)
from bench.spawn_client import BURST_POLL_S, answers, wait

BURST_METRIC = "burst_p95_s"  # p95 of the launches made at once (--burst), ours and stock

DOCKER = "/usr/bin/docker"
IMAGE = "gpu-portal/notebook:latest"
LABEL = "gpu-portal.bench"  # on every container and network this benchmark makes: spawn-<run>


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="launches per contender (default 5)")
    parser.add_argument("--burst", type=int, default=8, help="launches at once in the burst (default 8)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Stack:
    """Processes started for one contender, each in a process group of its own; stopped together."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        LOGS.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, command: list[str], env: dict[str, str], cwd: Path = ROOT) -> None:
        with (LOGS / f"bench-spawn-{name}.log").open("wb") as log:
            process = subprocess.Popen(
                command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes.append(process)

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop_process(process, group=True, timeout=20)


def cleanly(step: Callable[[], object], what: str) -> None:
    """A clean-up step that must not hide the error that brought us here, nor stop the next step."""
    try:
        step()
    except (OSError, subprocess.SubprocessError, BenchFailed) as error:
        print(f"bench spawn: could not {what}: {error}", file=sys.stderr)


def ours(runs: int, burst: int, tmp: Path, run_id: str) -> tuple[list[float], list[float]]:
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
        PORTAL_INSTANCE_ID=f"bench-{run_id}",  # the label on the portal's containers: removed by it
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
    stack = Stack()
    try:
        prepare_portal(env, burst)
        stack.start(
            "daphne",
            [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(ports["portal"]), "portal.asgi:application"],
            env,
        )
        # The worker as make run starts it (compose/supervisor/supervisord.conf), on the benchmark's own queue.
        worker = [str(BIN / "celery"), "-A", "portal", "worker", "-Q", "bench-spawn", "--pool", "threads", "-c", "8"]
        stack.start("worker", [*worker, "-l", "WARNING"], env)
        # The GPU host's agent, which alone makes the slices' MIG instances (sessions/gpus/orders.py).
        stack.start(
            "agent", [str(BIN / "python"), "manage.py", "gpu_agent", "--no-docker", "--interval-ms", "1000"], env
        )
        stack.start(
            "hub", [str(BIN / "jupyterhub"), "-f", str(ROOT / "compose/hub/jupyterhub_config.py")], env, tmp / "hub"
        )
        wait(lambda: answers_any(f"{public}/jupyter/hub/api/"), 60, what="our hub to answer")
        time.sleep(2)  # let the worker connect
        client = [str(BIN / "python"), "-m", "bench.spawn_client", str(runs), public]
        figures = []
        for extra in ([], [str(burst)]):
            what = f"the launch client (bench.spawn_client {' '.join([str(runs), public, *extra])})"
            result = run_checked([*client, *extra], what, cwd=ROOT, env=env)
            figures.append(list(json.loads(result.stdout.strip().splitlines()[-1])))
        return figures[0], figures[1]
    finally:
        stack.stop()
        volumes: list[str] = []
        cleanly(lambda: volumes.extend(work_volumes(env)), "read the portal's work volumes")
        cleanly(lambda: remove_labelled(f"gpu-portal.instance={env['PORTAL_INSTANCE_ID']}"), "remove our containers")
        cleanly(lambda: remove_volumes(volumes), "remove the work volumes")
        cleanly(lambda: manage(env, "ensure_user_network", "--remove"), "remove the portal's network")
        cleanly(drop_bench_database, "drop the benchmark's database")


def manage(env: dict[str, str], *args: str) -> str:
    return run_checked([str(BIN / "python"), "manage.py", *args], f"manage.py {args[0]}", cwd=ROOT, env=env).stdout


def prepare_portal(env: dict[str, str], burst: int) -> None:
    for step in (
        ["migrate", "-v0"],
        ["collectstatic", "--no-input", "-v0"],
        ["sync_gpus"],
        ["register_hub_client"],
        ["ensure_user_network"],
        ["ensure_notebook_image"],
    ):
        manage(env, *step)
    # People who may launch: the 'users' role (the migration made the group).
    names = ["bench", *(f"bench{n}" for n in range(burst))]
    code = (
        "from django.contrib.auth.models import Group, User; "
        f"[User.objects.create_user(name).groups.add(Group.objects.get(name='users')) for name in {names!r}]"
    )
    manage(env, "shell", "-c", code)


def work_volumes(env: dict[str, str]) -> list[str]:
    """The Docker volumes the portal made for people's work folders (named in its database)."""
    code = "from sessions.notebooks.models import WorkVolume; print(*WorkVolume.objects.values_list('name', flat=True))"
    return manage(env, "shell", "--no-imports", "-c", code).split()  # only the names on stdout


def remove_labelled(label: str) -> None:
    """Every container (running or not), then every network, carrying this label (key=value)."""
    containers = docker("ps", "-aq", "--filter", f"label={label}").split()
    if containers:
        docker("rm", "-f", *containers)
    networks = docker("network", "ls", "-q", "--filter", f"label={label}").split()
    if networks:
        docker("network", "rm", *networks)


def remove_volumes(names: list[str]) -> None:
    if names:
        docker("volume", "rm", "-f", *names)


def docker(*args: str) -> str:
    return run_checked([DOCKER, *args], f"docker {args[0]}").stdout


def free_subnet() -> str:
    """A 10.88.N.0/24 that no Docker network on this engine holds (N from 210 up)."""
    names = docker("network", "ls", "-q").split()
    found = docker("network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *names).split()
    for number in range(210, 250):
        if f"10.88.{number}.0/24" not in found:
            return f"10.88.{number}.0/24"
    raise RuntimeError("no free 10.88.210-249.0/24 for the benchmark's networks")


def answers_any(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def stock(runs: int, burst: int, tmp: Path, run_id: str) -> tuple[list[float], list[float]]:
    ports = {name: free_port() for name in ("public", "hub", "proxy_api")}
    token = secrets.token_hex(16)
    data = tmp / "stock"
    data.mkdir()
    # DockerSpawner's documented set-up off the host network: a user-defined bridge, the hub on its gateway.
    network, subnet = f"bench-stock-{run_id}", free_subnet()
    gateway = str(next(ipaddress.IPv4Network(subnet).hosts()))
    env = dict(os.environ)
    env.update(
        BENCH_HUB_DATA=str(data),
        BENCH_PUBLIC_PORT=str(ports["public"]),
        BENCH_HUB_IP=gateway,
        BENCH_HUB_PORT=str(ports["hub"]),
        BENCH_PROXY_API_PORT=str(ports["proxy_api"]),
        BENCH_NETWORK=network,
        BENCH_TOKEN=token,
        BENCH_LABEL=f"{LABEL}={run_id}",  # stock_config.py puts it on the containers DockerSpawner makes
    )
    public = f"http://127.0.0.1:{ports['public']}"
    stack = Stack()
    try:
        docker("network", "create", "--label", f"{LABEL}={run_id}", "--subnet", subnet, network)
        stack.start("stock-hub", [str(BIN / "jupyterhub"), "-f", str(ROOT / "bench/hub/stock_config.py")], env, data)
        wait(lambda: answers_any(f"{public}/hub/api/"), 60, what="the stock hub to answer")
        api = f"http://{gateway}:{ports['hub']}/hub/api"
        call(api + "/users/bench", "POST", token)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            call(api + "/users/bench/server", "POST", token)
            wait(lambda: answers(f"{public}/user/bench/api"), what="the stock server to answer")
            times.append(time.perf_counter() - started)
            call(api + "/users/bench/server", "DELETE", token)
            wait(lambda: not container_exists("bench-stock-bench"), 60, what="the stock server's container to go")
        return times, stock_burst(api, public, token, burst)
    finally:
        stack.stop()
        cleanly(lambda: remove_labelled(f"{LABEL}={run_id}"), "remove the stock hub's containers and network")


def stock_burst(api: str, public: str, token: str, count: int) -> list[float]:
    """``count`` users' servers requested from the stock hub at the same moment."""
    users = [f"burst{n}" for n in range(count)]
    for user in users:
        call(f"{api}/users/{user}", "POST", token)
    gate = time.monotonic() + 1.0

    def one(user: str) -> float:
        time.sleep(max(0.0, gate - time.monotonic()))
        started = time.perf_counter()
        call(f"{api}/users/{user}/server", "POST", token)
        wait(lambda: answers(f"{public}/user/{user}/api"), every=BURST_POLL_S, what=f"{user}'s stock server")
        return time.perf_counter() - started

    with ThreadPoolExecutor(count) as pool:
        times = list(pool.map(one, users))
    for user in users:
        call(f"{api}/users/{user}/server", "DELETE", token)
    for user in users:
        wait(lambda user=user: not container_exists(f"bench-stock-{user}"), 90, what=f"{user}'s container to go")
    return times


def call(url: str, method: str, token: str) -> None:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"}, data=b"{}")
    with urllib.request.urlopen(request, timeout=30):
        return


def container_exists(name: str) -> bool:
    return bool(docker("ps", "-aq", "--filter", f"name=^{name}$").strip())


def floor(runs: int, run_id: str, bridged: bool = False, image: str = IMAGE, timeout: float = 120) -> list[float]:
    """A bare `docker run` of the image with `jupyter lab` until /api answers: on the host's network, or on a
    fresh bridge (what a network namespace and veth of its own cost every launch)."""
    label = f"{LABEL}={run_id}"
    network = f"bench-floor-{run_id}" if bridged else "host"
    try:
        if bridged:
            docker("network", "create", "--label", label, "--subnet", free_subnet(), network)
        return [one_floor(number, network, label, image, timeout) for number in range(runs)]
    finally:
        cleanly(lambda: remove_labelled(label), "remove the floor's containers and network")


def one_floor(number: int, network: str, label: str, image: str, timeout: float) -> float:
    port, name = free_port(), f"bench-floor-{label.rsplit('=', 1)[1]}-{number}"
    ip = "127.0.0.1" if network == "host" else "0.0.0.0"  # noqa: S104 (inside the container's own namespace)
    command = ["run", "-d", "--rm", "--label", label, "--name", name, "--network", network, image, "jupyter", "lab"]
    command += ["--ip", ip, f"--port={port}", "--no-browser", "--ServerApp.token=", "--ServerApp.password="]
    started = time.perf_counter()
    docker(*command)
    address = "127.0.0.1"
    if network != "host":
        address = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name).strip()
    wait(lambda: answers(f"http://{address}:{port}/api"), timeout, what=f"JupyterLab in {name} to answer")
    elapsed = time.perf_counter() - started
    docker("rm", "-f", name)
    return elapsed


def run(args: argparse.Namespace) -> Result:
    for script in ("ensure-docker", "ensure-proxy", "build-notebook-image"):
        run_checked([str(ROOT / "compose/bin" / script)], f"compose/bin/{script}")
    run_id = f"spawn-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="bench-spawn-") as name:
        tmp = Path(name)
        ours_runs, ours_burst = ours(args.runs, args.burst, tmp, run_id)
        stock_runs, stock_burst_runs = stock(args.runs, args.burst, tmp, run_id)
        figures = {
            "ours": ours_runs,
            "stock": stock_runs,
            "floor": floor(args.runs, run_id),
            "floor_bridged": floor(args.runs, run_id, bridged=True),
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
    record(  # the burst's own line in the history, beside the headline's
        name="spawn",
        metric=BURST_METRIC,
        value=p95["ours"],
        unit="s",
        baseline=p95["stock"],
        baseline_name=f"stock JupyterHub + DockerSpawner, {args.burst} at once",
        ratio=round(p95["ours"] / p95["stock"], 3),
        goal="ratio <= 1.0",
        met=p95["ours"] <= p95["stock"],
    )
    return result
