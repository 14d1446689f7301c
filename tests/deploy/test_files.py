"""The deployment's files and images against bad input (issue 33): both files read clean by the tools that
deploy them, they agree with each other, a missing secret is named before anything starts, an example or
empty one is refused by the program, a malformed setting stops it with its name, a base image of another
system is refused by the build, and the portal image runs what a Kubernetes render Job asks of it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sessions.runtime.kube.jobs import Images, RenderRun, render_job
from sessions.runtime.kube.slices import DEVICE_PLUGIN, KubeSlice
from sessions.runtime.spec import Limits
from tests.conftest import ROOT
from tests.deploy.deployment import COMPOSE, DOCKER, build_images

pytestmark = [pytest.mark.docker, pytest.mark.deploy]
COMPOSE_FILE, STACK_FILE = ROOT / "compose/compose.yaml", ROOT / "compose/stack.yaml"


@pytest.fixture
def env_file() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gpu-portal-deploy-env-"))
    path = folder / "portal.env"
    subprocess.run([str(ROOT / "compose/bin/make-stack-env"), str(path)], check=True, capture_output=True)
    yield path
    shutil.rmtree(folder)


def without(env_file: Path, name: str, value: str | None = None) -> Path:
    """The env file with ``name`` left out, or given ``value``."""
    lines = [line for line in env_file.read_text().splitlines() if not line.startswith(name + "=")]
    if value is not None:
        lines.append(f"{name}={value}")
    changed = env_file.with_name(f"{name}.env")
    changed.write_text("\n".join(lines) + "\n")
    return changed


def compose_config(env_file: Path) -> subprocess.CompletedProcess[str]:
    command = [COMPOSE, "--env-file", str(env_file), "-f", str(COMPOSE_FILE), "config", "-q"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def stack_config(env_file: Path) -> subprocess.CompletedProcess[str]:
    command = [str(ROOT / "compose/bin/stack"), str(env_file), "config"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_both_files_read_clean_with_a_made_env_file(env_file: Path) -> None:
    composed = compose_config(env_file)
    assert (composed.returncode, composed.stdout, composed.stderr) == (0, "", "")
    stacked = stack_config(env_file)
    assert stacked.returncode == 0 and stacked.stderr == "", stacked.stderr  # nothing ignored as unsupported
    services = yaml.safe_load(stacked.stdout)["services"]
    assert services["fence"]["cap_add"] == ["NET_ADMIN"]
    assert services["proxy"]["environment"]["PORTAL_PROXY_IP"] == "127.0.0.1"


@pytest.mark.parametrize("name", ["PORTAL_SECRET_KEY", "PORTAL_FILE_STORE_KEY", "PORTAL_OIDC_RSA_PRIVATE_KEY"])
def test_a_missing_secret_is_named_before_anything_starts(env_file: Path, name: str) -> None:
    for answer in (compose_config(without(env_file, name)), stack_config(without(env_file, name))):
        assert answer.returncode != 0
        assert f"set {name}" in answer.stderr, answer.stderr


def test_a_line_that_is_not_a_setting_is_refused_by_name(env_file: Path) -> None:
    broken = env_file.with_name("broken.env")
    broken.write_text(env_file.read_text() + "PORTAL PORT 8000\n")
    answer = stack_config(broken)
    assert answer.returncode != 0 and "not KEY=VALUE: PORTAL PORT 8000" in answer.stderr, answer.stderr


# What only one of the two tools reads: Compose's start order and restarts, Swarm's placement and restarts, and
# how each puts a service on the host's network.
TOOL_KEYS = {"restart", "depends_on", "network_mode", "deploy", "networks"}


def definitions(path: Path) -> dict[str, dict[str, object]]:
    services = yaml.safe_load(path.read_text())["services"]
    return {name: {k: v for k, v in service.items() if k not in TOOL_KEYS} for name, service in services.items()}


def test_the_stack_file_runs_what_the_compose_file_runs() -> None:
    """One set of programs, two files: every service the same in both (image, program, user, settings, volumes,
    health check, capabilities) but for what only one tool reads; the engine's socket in the same services."""
    composed, stacked = definitions(COMPOSE_FILE), definitions(STACK_FILE)
    assert composed.keys() == stacked.keys()
    for name in composed:
        assert composed[name] == stacked[name], name
    raw = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    assert all(service["network_mode"] == "host" for service in raw.values())
    sockets = sorted(name for name, service in composed.items() if "docker.sock" in str(service.get("volumes")))
    assert sockets == ["agent", "estimate", "fence", "hub", "render", "worker"]


@pytest.fixture(scope="module")
def portal_image() -> str:
    build_images()
    return "gpu-portal/portal:latest"


def run_portal(env_file: Path, *command: str) -> subprocess.CompletedProcess[str]:
    docker = [DOCKER, "run", "--rm", "--network", "none", "--env-file", str(env_file)]
    docker += ["-e", "PORTAL_SECRETS_FROM_ENVIRONMENT=true", "-e", "DATABASE_URL=postgres://portal@127.0.0.1:1/portal"]
    return subprocess.run([*docker, "gpu-portal/portal:latest", *command], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value", ["", "change-me", "change-me-32-random-characters-at-least"])
def test_an_empty_or_example_secret_is_refused_by_the_program_with_its_name(
    portal_image: str, env_file: Path, value: str
) -> None:
    answer = run_portal(without(env_file, "PORTAL_HUB_OAUTH_SECRET", value), "web")
    assert answer.returncode != 0
    assert "refused: PORTAL_HUB_OAUTH_SECRET is empty or still the example's value" in answer.stderr, answer.stderr


def test_a_secret_left_out_stops_the_program_that_needs_it_with_its_name(portal_image: str, env_file: Path) -> None:
    answer = run_portal(without(env_file, "PORTAL_SECRET_KEY"), "python", "manage.py", "check")
    assert answer.returncode != 0
    assert "PORTAL_SECRET_KEY" in answer.stderr, answer.stderr[-2000:]


def test_a_malformed_setting_stops_the_program_with_its_name(portal_image: str, env_file: Path) -> None:
    answer = run_portal(
        without(env_file, "PORTAL_NOTEBOOK_SUBNET", "ten-dot-eighty-eight"), "python", "manage.py", "check"
    )
    assert answer.returncode != 0
    assert "PORTAL_NOTEBOOK_SUBNET must be an IPv4 subnet" in answer.stderr, answer.stderr[-2000:]


@pytest.mark.parametrize(
    ("script", "image"), [("build-stack-images", "portal"), ("build-notebook-image", ""), ("build-render-image", "")]
)
def test_a_base_image_of_another_system_is_refused_before_anything_is_built(script: str, image: str) -> None:
    subprocess.run([str(ROOT / "compose/bin/build-busybox-image")], check=True, capture_output=True, timeout=300)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PORTAL_IMAGE_BASE": "gpu-portal/busybox:latest"}
    command = [str(ROOT / "compose/bin" / script), *([image] if image else [])]
    answer = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert answer.returncode == 1
    assert "built on Debian 12 (bookworm); BASE has no /etc/os-release" in answer.stderr, answer.stderr
    assert f"{script}: refused base gpu-portal/busybox:latest" in answer.stderr


def unordered(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services with their volumes as a set: docker-compose lists a merged service's volumes in another order."""
    return {
        name: {**service, "volumes": sorted(map(str, service.get("volumes", [])))} for name, service in services.items()
    }


def test_the_gpu_host_override_gives_the_agent_nvml_and_mig_and_nothing_else(env_file: Path) -> None:
    """compose/gpu-host.yaml merged by each tool: the agent keeps every setting and gains what NVIDIA's runtime
    asks of a container that changes MIG instances; every other service stays as it was."""
    override = str(ROOT / "compose/gpu-host.yaml")
    plain_compose = [COMPOSE, "--env-file", str(env_file), "-f", str(COMPOSE_FILE)]
    merged = {}
    for tool, plain, with_gpus in (
        ("compose", [*plain_compose, "config"], [*plain_compose, "-f", override, "config"]),
        ("stack", [str(ROOT / "compose/bin/stack"), str(env_file), "config"], None),
    ):
        with_gpus = with_gpus or [*plain, override]
        before, after = (
            yaml.safe_load(subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout)
            for command in (plain, with_gpus)
        )
        agent = after["services"].pop("agent")
        assert agent["cap_add"] == ["SYS_ADMIN"], tool
        assert agent["environment"] == {
            **before["services"]["agent"]["environment"],
            "NVIDIA_VISIBLE_DEVICES": "all",
            "NVIDIA_DRIVER_CAPABILITIES": "utility",
            "NVIDIA_MIG_CONFIG_DEVICES": "all",
            "NVIDIA_MIG_MONITOR_DEVICES": "all",
        }, tool
        before["services"].pop("agent")
        assert unordered(after["services"]) == unordered(before["services"]), tool
        merged[tool] = agent["environment"]["PORTAL_GPU_BACKEND"]
    assert merged == {"compose": "simulated", "stack": "simulated"}  # the env file's choice, not the override's


def test_the_swarm_hosts_file_needs_its_settings_and_places_each_program(env_file: Path, tmp_path: Path) -> None:
    """compose/swarm-hosts.yaml over the stack file: without the manager's address, the GPU hosts' engines or
    their certificates it names what is missing; with them, the manager's programs get the engines and the
    certificates (secrets), the GPU hosts' programs reach the manager's address and know their node, and the
    database, Redis and daphne listen there too."""
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("not read by config\n")
    settings = {
        "PORTAL_MANAGER_ADDRESS": "192.0.2.10",
        "PORTAL_DOCKER_ENGINES": "gpu-2=tcp://192.0.2.12:2376",
        "PORTAL_DOCKER_TLS_FILES": str(tmp_path),
    }
    plain = env_file.read_text()

    def config(given: dict[str, str]) -> subprocess.CompletedProcess[str]:
        env_file.write_text(plain + "".join(f"{key}={value}\n" for key, value in given.items()))
        command = [str(ROOT / "compose/bin/stack"), str(env_file), "config", str(ROOT / "compose/swarm-hosts.yaml")]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    for left_out in settings:
        missing = config({key: value for key, value in settings.items() if key != left_out})
        assert missing.returncode != 0 and f"set {left_out}" in missing.stderr, (left_out, missing.stderr)
    read = config(settings)
    assert read.returncode == 0 and read.stderr == "", read.stderr
    services = yaml.safe_load(read.stdout)["services"]
    for name in ("web", "worker", "hub", "beat", "estimate"):
        environment = services[name]["environment"]
        assert environment["PORTAL_DOCKER_ENGINES"] == "gpu-2=tcp://192.0.2.12:2376", name
        assert environment["PORTAL_DOCKER_TLS_DIR"] == "/run/secrets/docker-tls", name
        assert {secret["target"] for secret in services[name]["secrets"]} == {
            f"docker-tls/{file}" for file in ("ca.pem", "cert.pem", "key.pem")
        }, name
    for name in ("agent", "render", "fence"):
        service = services[name]
        assert service["deploy"]["mode"] == "global", name
        assert service["deploy"]["placement"]["constraints"] == ["node.labels.gpu-portal.gpu-host == true"], name
        assert "@192.0.2.10:" in service["environment"]["DATABASE_URL"], name
        assert service["environment"]["PORTAL_GPU_HOST_NAME"] == "{{.Node.Hostname}}", name
        assert "PORTAL_DOCKER_ENGINES" not in service["environment"] and "secrets" not in service, name
    assert "listen_addresses=127.0.0.1,192.0.2.10" in services["postgres"]["command"]
    assert services["redis"]["command"][:4] == ["redis-server", "--bind", "127.0.0.1", "192.0.2.10"]
    assert services["web"]["environment"]["PORTAL_BIND"] == "127.0.0.1,192.0.2.10"


def test_the_portal_image_runs_a_render_jobs_file_containers_as_the_job_gives_them(
    portal_image: str, tmp_path: Path
) -> None:
    """The Kubernetes render Job's fetch container (issue 34), from its generated spec, in the portal image with
    the spec's user, a read-only root and no capabilities: it runs without Django or a key, and says in the
    termination message why it stopped (here: no file store answers, there is no network)."""
    gpu = "GPU-5c3f0a55-8d54-4a1b-9e7e-0d2c9b1f7a10"
    run = RenderRun(3, "chunk0-1", ("blender",), Limits(1.0, 2**30, 64), "ab" * 32, 2**20, 2**20, 60, {})
    job = render_job(
        run, KubeSlice("whole", "", "gpu-node-1", gpu, gpu), DEVICE_PLUGIN, namespace="gpu-portal",
        images=Images("gpu-portal/render:latest", portal_image), store_url="http://127.0.0.1:9", part_bytes=2**20,
    )  # fmt: skip
    fetch = job["spec"]["template"]["spec"]["initContainers"][0]
    (tmp_path / "token").write_text("a-token")
    (tmp_path / "termination-log").write_text("")
    (tmp_path / "termination-log").chmod(0o666)  # the kubelet's is the container's to write
    (tmp_path / "scene").mkdir(mode=0o777)
    tmp_path.chmod(0o755)
    security = fetch["securityContext"]
    docker = [DOCKER, "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL"]
    docker += ["--security-opt", "no-new-privileges", "--user", f"{security['runAsUser']}:{security['runAsGroup']}"]
    docker += ["-v", f"{tmp_path / 'token'}:/run/gpu-portal/token:ro", "-v", f"{tmp_path / 'scene'}:/scene"]
    docker += ["-v", f"{tmp_path / 'termination-log'}:/dev/termination-log"]
    for item in fetch["env"]:
        docker += ["-e", f"{item['name']}={item['value']}"]
    command = fetch["command"]
    answer = subprocess.run(
        [*docker, "--entrypoint", command[0], fetch["image"], *command[1:]], capture_output=True, text=True, timeout=120
    )
    assert answer.returncode == 1, answer.stderr[-2000:]
    assert "the portal's file store did not answer" in answer.stderr, answer.stderr[-2000:]
    assert "did not answer" in (tmp_path / "termination-log").read_text(), "the kubelet shows this message"
