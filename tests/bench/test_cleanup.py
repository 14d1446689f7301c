"""Benchmarks clean up what they started, on failure too, and a failed step says what it wrote to stderr."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.server import BenchFailed, run_checked
from bench.spawn import DOCKER, Stack, docker, floor

BUSYBOX = "gpu-portal/busybox:latest"  # runs, but has no JupyterLab: the floor's launch fails


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def labelled(kind: list[str], label: str) -> list[str]:
    out = subprocess.run([DOCKER, *kind, "--filter", f"label={label}"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_a_failed_step_raises_with_what_it_wrote_to_stderr() -> None:
    broken = [sys.executable, "-c", "import sys; print('half a figure'); sys.exit('the client broke: no hub')"]
    with pytest.raises(BenchFailed) as failed:
        run_checked(broken, "the launch client")
    assert "the launch client exited with 1" in str(failed.value)
    assert "the client broke: no hub" in str(failed.value)


def test_stopping_a_stack_ends_what_its_processes_started_too(tmp_path: Path) -> None:
    """As the hub starts configurable-http-proxy: a child of a child must not outlive the benchmark."""
    pid_file = tmp_path / "grandchild"
    stack = Stack()
    stack.start("cleanup-test", ["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], dict(os.environ))
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    assert alive(grandchild)
    stack.stop()
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


@pytest.fixture
def silent_image(docker_engine: str, tmp_path: Path) -> Iterator[str]:
    """An image whose `jupyter` runs and never answers (built from the local busybox, offline)."""
    tag = f"gpu-portal/bench-silent:{uuid.uuid4().hex[:8]}"
    script = tmp_path / "jupyter"
    script.write_text("#!/bin/sh\nexec sleep 300\n")
    script.chmod(0o755)
    container = docker("create", BUSYBOX).strip()
    try:
        docker("cp", str(script), f"{container}:/bin/jupyter")
        docker("commit", container, tag)
    finally:
        docker("rm", "-f", container)
    yield tag
    docker("rmi", "-f", tag)


@pytest.mark.docker
def test_a_launch_docker_refuses_says_why_and_leaves_no_network(docker_engine: str) -> None:
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BenchFailed) as failed:
        floor(1, run_id, bridged=True, image=BUSYBOX, timeout=10)
    assert "jupyter" in str(failed.value) and "not found" in str(failed.value)  # Docker's own words
    label = f"gpu-portal.bench={run_id}"
    assert labelled(["ps", "-aq"], label) == []
    assert labelled(["network", "ls", "-q"], label) == []


@pytest.mark.docker
def test_a_launch_that_never_answers_leaves_no_container_running(silent_image: str) -> None:
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TimeoutError, match="JupyterLab in bench-floor-"):
        floor(1, run_id, bridged=True, image=silent_image, timeout=3)
    label = f"gpu-portal.bench={run_id}"
    assert labelled(["ps", "-aq"], label) == []
    assert labelled(["network", "ls", "-q"], label) == []
