"""The JupyterLab image of notebook sessions, built offline by compose/bin/build-notebook-image."""

from __future__ import annotations

import http.client
import subprocess
import time
import uuid
from importlib.metadata import version

import pytest

from tests.helpers.processes import ROOT, free_port

pytestmark = pytest.mark.docker

DOCKER = "/usr/bin/docker"  # the real CLI; /usr/local/bin/docker may be a client-only stub
IMAGE = "gpu-portal/notebook:latest"


def docker(*args: str, timeout: float = 60) -> str:
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, check=True, timeout=timeout)
    return result.stdout.strip()


@pytest.fixture(scope="module")
def notebook_image(docker_engine: str) -> str:
    """The current image; the build script returns at once when it is up to date."""
    subprocess.run([str(ROOT / "compose/bin/build-notebook-image")], check=True, timeout=600)
    return IMAGE


def lab_status(port: int) -> int | None:
    """The status /lab answers with, redirects not followed (a login redirect is not a pass)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/lab")
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


def test_the_image_runs_as_the_unprivileged_user_jovyan_in_its_work_folder(notebook_image: str) -> None:
    output = docker("run", "--rm", "--network", "none", notebook_image, "sh", "-c", "id -u; id -un; pwd; echo $HOME")
    assert output.splitlines() == ["1000", "jovyan", "/home/jovyan/work", "/home/jovyan"]


def test_the_image_starts_jupyterhub_singleuser_of_the_hubs_jupyterhub_version(notebook_image: str) -> None:
    config = docker("image", "inspect", "--format", "{{json .Config.Cmd}} {{.Config.User}}", notebook_image)
    assert config == '["jupyterhub-singleuser"] jovyan'
    output = docker("run", "--rm", "--network", "none", notebook_image, "jupyterhub-singleuser", "--version")
    assert output.splitlines()[-1] == version("jupyterhub")


def test_jupyterlab_starts_without_building_the_iri_parsers_jsonschema_would_import(notebook_image: str) -> None:
    """rfc3987-syntax cost every session a second at start (see the Dockerfile); its absence must not break the
    event schemas JupyterLab validates with the same format checker."""
    check = (
        "import sys, jupyter_events.validators as v;"
        "v.validate_schema(v.EVENT_METASCHEMA);"
        "print('rfc3987_syntax' in sys.modules, 'iri' in v.draft7_format_checker.checkers)"
    )
    output = docker("run", "--rm", "--network", "none", notebook_image, "python3", "-c", check)
    assert output.splitlines()[-1] == "False False"


def test_jupyterlab_in_the_image_answers_200_on_lab_through_127_0_0_1(notebook_image: str) -> None:
    port = free_port()
    name = f"nbtest-{uuid.uuid4().hex[:8]}"
    try:
        docker(
            "run",
            "--detach",
            "--name",
            name,
            "--network",
            "host",
            notebook_image,
            "jupyter",
            "lab",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-browser",
            "--ServerApp.token=",
        )
        deadline = time.monotonic() + 30
        status = lab_status(port)
        while status != 200 and time.monotonic() < deadline:
            if docker("inspect", "--format", "{{.State.Running}}", name) != "true":
                break
            time.sleep(0.2)
            status = lab_status(port)
        if status != 200:
            logs = subprocess.run([DOCKER, "logs", name], capture_output=True, text=True, check=False)
            pytest.fail(f"/lab answered {status}; container log:\n{logs.stdout}{logs.stderr}")
    finally:
        subprocess.run([DOCKER, "rm", "--force", name], capture_output=True, check=False)
