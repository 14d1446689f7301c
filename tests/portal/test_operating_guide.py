"""The operator's guide (docs/operating.md) matches the files it describes: every setting, path, management command
and container program it names exists, its table of services is the deployment files' (their users included), and
every command it shows is run by a test, named here, or marked as one for a real GPU host."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from django.core.management import get_commands

from tests.portal.test_readme import READERS, ROOT, variables_read

GUIDE = ROOT / "docs/operating.md"
ENTRYPOINT = ROOT / "compose/images/portal/entrypoint"
GPU_HOST_MARK = "(on a real GPU host)"

# What the guide has the operator make (compose/bin/make-stack-env writes it; it is never committed).
MADE_BY_THE_OPERATOR = {"compose/portal.env"}

SMOKE_TEST, FILES_TEST = "tests/deploy/test_smoke.py", "tests/deploy/test_files.py"
# Each command the guide shows for any host, by its program (and docker's, docker-compose's or compose/bin/stack's
# subcommand), with the file that runs it: a test (through the helpers it imports), or the test runner.
RUN_BY_TESTS = {
    "compose/bin/setup-python": "compose/bin/test",
    "compose/bin/build-stack-images": SMOKE_TEST,
    "compose/bin/build-notebook-image": "tests/sessions_runtime/test_notebook_image.py",
    "compose/bin/build-render-image": "tests/sessions_runtime/test_render_sandbox.py",
    "compose/bin/make-stack-env": FILES_TEST,
    "install": SMOKE_TEST,
    "docker-compose config": FILES_TEST,
    "docker-compose up": SMOKE_TEST,
    "docker-compose ps": SMOKE_TEST,
    "docker-compose logs": SMOKE_TEST,
    "docker-compose stop": SMOKE_TEST,
    "docker-compose down": SMOKE_TEST,
    "docker run": SMOKE_TEST,
    "docker swarm": SMOKE_TEST,
    "docker node": SMOKE_TEST,
    "compose/bin/stack config": FILES_TEST,
    "compose/bin/stack deploy": SMOKE_TEST,
    "compose/bin/backup": SMOKE_TEST,
    "compose/bin/restore": SMOKE_TEST,
}
# How a test names docker and docker-compose (tests/deploy/deployment.py's constants, its compose() method).
PROGRAM_IN_TESTS = {"docker": r"\bDOCKER\b", "docker-compose": r"\bCOMPOSE\b|\.compose\("}
# Options of docker and docker-compose that take a value, so the subcommand is the first word after them.
VALUE_OPTIONS = {"--env-file", "-f", "--file", "-p", "--project-name", "-c", "--compose-file", "-H", "--host"}

SETTING = re.compile(r"\b(PORTAL_[A-Z0-9_]*[A-Z0-9])(_\*)?")
PATH = re.compile(r"(?<![\w./-])((?:compose|docs|sessions|portal|tests)/[\w.*/-]*[\w*])")
MANAGE = re.compile(r"\bmanage\.py (\w+)")
ROLE = re.compile(r"\bentrypoint ([a-z][a-z-]*)\b|\bcommand: \[\s*\"([a-z][a-z-]*)\"")
BLOCK = re.compile(r"^ *```(\w*)\n(.*?)^ *```$", re.MULTILINE | re.DOTALL)  # indented in a list too
TABLE_ROW = re.compile(r"^\| `([a-z-]+)` \|", re.MULTILINE)
USER_CELL = re.compile(r"^\| `([a-z-]+)` \|.*\| ([^|]+?) \|$", re.MULTILINE)
SERVICE_ROW = re.compile(r"^\| `([a-z-]+)` \| (?:portal|hub), `([a-z-]+)`", re.MULTILINE)


def guide() -> str:
    return GUIDE.read_text()


def known_settings() -> set[str]:
    """Every variable the portal's code reads (the README test's readers and the health checks), and every PORTAL_
    name in the deployment's own files: the Compose and stack files, the example env file, the scripts."""
    read = set().union(*(variables_read(path) for path in [*READERS, "compose/images/portal/health.py"]))
    deployment = [
        *ROOT.glob("compose/*.yaml"),
        ROOT / "compose/portal.env.example",
        *ROOT.glob("compose/bin/*"),
        *ROOT.glob("compose/images/*/entrypoint"),
    ]
    named = {name for path in deployment for name, _ in SETTING.findall(path.read_text())}
    return read | named


def entrypoint_roles() -> set[str]:
    body = ENTRYPOINT.read_text().split('case "$role" in', 1)[1].split("\nesac", 1)[0]
    labels = re.findall(r"^\s+([a-z|-]+)\)\s*$", body, flags=re.MULTILINE)
    return {role for label in labels for role in label.split("|")}


def shell_commands() -> list[tuple[str, bool]]:
    """Each command of the guide's sh blocks, its continuation lines joined, and whether its block is marked as
    one for a real GPU host (on the last line of text before the block)."""
    text = guide()
    found: list[tuple[str, bool]] = []
    for block in BLOCK.finditer(text):
        if block.group(1) != "sh":
            continue
        before = [line for line in text[: block.start()].splitlines() if line.strip()]
        on_gpu_host = bool(before) and GPU_HOST_MARK in before[-1]
        joined = block.group(2).replace("\\\n", " ")
        lines = [line.strip() for line in joined.splitlines()]
        found += [(line, on_gpu_host) for line in lines if line and not line.startswith("#")]
    return found


def command_key(line: str) -> str:
    """The program, and for docker and docker-compose the subcommand: what tells one command from another."""
    words = shlex.split(line, comments=True)
    program = words[0]
    if program == "compose/bin/stack":  # compose/bin/stack ENV_FILE deploy|config
        return f"{program} {words[2]}"
    if program not in ("docker", "docker-compose"):
        return program
    skip = False
    for word in words[1:]:
        if skip:
            skip = False
        elif word in VALUE_OPTIONS:
            skip = True
        elif not word.startswith("-"):
            return f"{program} {word}"
    return program


def test_every_setting_it_names_exists() -> None:
    known = known_settings()
    named = SETTING.findall(guide())
    assert named
    missing = set()
    for name, wildcard in named:
        if wildcard and not any(setting.startswith(f"{name}_") for setting in known):
            missing.add(f"{name}_*")
        elif not wildcard and name not in known:
            missing.add(name)
    assert missing == set()


def test_every_path_it_names_exists() -> None:
    named = {match.rstrip("/.") for match in PATH.findall(guide())}
    assert "compose/compose.yaml" in named
    missing = {path for path in named if not any(ROOT.glob(path))}
    assert missing - MADE_BY_THE_OPERATOR == set()


def test_every_management_command_it_names_is_real() -> None:
    named = set(MANAGE.findall(guide()))
    assert "setup_once" in named
    assert named - set(get_commands()) == set()


def test_every_container_program_it_names_is_in_the_entrypoint() -> None:
    text = guide()
    named = {one or other for one, other in ROLE.findall(text)} | {role for _, role in SERVICE_ROW.findall(text)}
    roles = entrypoint_roles()
    assert {"setup", "web", "health", "fence"} <= roles  # the entrypoint's case list was read
    assert named - roles == set()


def test_its_table_of_services_is_the_deployment_files() -> None:
    services = yaml.safe_load((ROOT / "compose/compose.yaml").read_text())["services"]
    stacked = yaml.safe_load((ROOT / "compose/stack.yaml").read_text())["services"]
    assert set(TABLE_ROW.findall(guide())) == set(services) == set(stacked)


def image_user(image: str) -> str:
    """The last USER of the image's Dockerfile (gpu-portal/NAME:TAG is compose/images/NAME/Dockerfile)."""
    name = image.split("/", 1)[1].split(":", 1)[0]
    users = re.findall(r"^USER (\S+)", (ROOT / f"compose/images/{name}/Dockerfile").read_text(), flags=re.MULTILINE)
    return str(users[-1])


def test_its_user_column_is_the_files_users() -> None:
    """Each service's user as its file or image sets it; "then `portal`" for the programs the entrypoint takes
    from root to the portal's user once they hold the socket's group."""
    cells = dict(USER_CELL.findall(guide()))
    body = ENTRYPOINT.read_text().split('case "$role" in', 1)[1]
    dropping = set(re.findall(r"^\s+([a-z-]+)\)\s*\n\s+as_portal_with_socket\b", body, flags=re.MULTILINE))
    assert dropping == {"worker", "estimate", "render"}
    services = yaml.safe_load((ROOT / "compose/compose.yaml").read_text())["services"]
    for name, service in services.items():
        user = service.get("user") or image_user(service["image"])
        role = service["command"][0]
        expected = f"{'root' if user == 'root' else f'`{user}`'}{', then `portal`' if role in dropping else ''}"
        assert cells[name].split(", `NET_ADMIN`")[0] == expected, (name, cells[name])


def test_every_code_block_says_what_it_holds() -> None:
    """A command cannot hide from the next test in a block without a language."""
    assert {block.group(1) for block in BLOCK.finditer(guide())} <= {"sh", "yaml", "nginx"}


def test_every_command_it_shows_is_run_by_a_test_or_marked_for_a_real_gpu_host() -> None:
    commands = shell_commands()
    assert any(on_gpu_host for _, on_gpu_host in commands)
    assert {
        line for line, on_gpu_host in commands if not on_gpu_host and command_key(line) not in RUN_BY_TESTS
    } == set()


def runner_text(runner: str) -> str:
    """The file, and the modules of tests/ it imports (the deployment's helpers run most commands)."""
    text = (ROOT / runner).read_text()
    imported = re.findall(r"^from (tests(?:\.\w+)+) import", text, flags=re.MULTILINE)
    files = [ROOT / f"{module.replace('.', '/')}{end}" for module in imported for end in (".py", "/__init__.py")]
    return "\n".join([text, *(path.read_text() for path in files if path.is_file())])


def test_each_test_named_as_running_a_command_runs_it() -> None:
    """Some line of the runner names the program (a string that ends in its name; docker and docker-compose as
    the tests name them) and, for a subcommand, gives it as a string of its own."""
    for key, runner in RUN_BY_TESTS.items():
        program, _, subcommand = key.partition(" ")
        named = PROGRAM_IN_TESTS.get(program, rf"(?:^|[\s\"'/]){re.escape(Path(program).name)}(?:$|[\s\"'])")
        lines = runner_text(runner).splitlines()
        given = f'"{subcommand}"' if subcommand else ""
        assert any(re.search(named, line) and given in line for line in lines), (key, runner)


def test_every_command_mapped_to_a_test_is_in_the_guide() -> None:
    """A command the guide no longer shows leaves the map too."""
    assert {command_key(line) for line, _ in shell_commands()} >= RUN_BY_TESTS.keys()
