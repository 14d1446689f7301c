"""`make run` under supervisord: a program killed with -9 comes back and the others keep running; a program
that keeps failing at start is started again later; a run after a crashed supervisor starts cleanly;
Ctrl-C stops everything and exits 0."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.processes import answers_200
from tests.helpers.supervised import SupervisedRun, group_members

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.celery]

LOGS = Path(__file__).resolve().parents[2] / "artifacts" / "logs"
PORTAL = ["web", "proxy", "hub", "worker", "render", "estimate", "beat", "agent"]
HELPERS = ["console", "revive"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SupervisedRun]:
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / "make-run.log").unlink(missing_ok=True)
    # Quick to give up and quick to try again, so the FATAL case below takes seconds, not minutes.
    started = SupervisedRun(
        tmp_path_factory.mktemp("make-run"), LOGS / "make-run.log", PORTAL_START_RETRIES="1", PORTAL_REVIVE_SECONDS="2"
    )
    try:
        started.answered_at_announcement = started.answered_when_announced(LOGS / "make-run.log", timeout=240)
        started.ready(timeout=240)
        yield started
    finally:
        started.clean_up()


def still_answering(run: SupervisedRun, killed: str) -> list[Callable[[], bool]]:
    """What must keep answering while one program is down."""
    checks = []
    if killed not in ("web", "proxy"):
        checks.append(lambda: answers_200(f"{run.public}/healthz"))
    if killed == "proxy":
        checks.append(lambda: answers_200(f"{run.daphne}/healthz"))
    if killed != "hub":
        checks.append(lambda: answers_200(run.hub_api))
    return checks


def back_again(run: SupervisedRun, name: str) -> Callable[[], bool]:
    """The program's own sign of life, beyond a new pid."""
    if name == "web":
        return lambda: answers_200(f"{run.daphne}/healthz") and answers_200(f"{run.public}/healthz")
    if name == "proxy":
        # The portal behind it at once; the hub's route once the hub has put its routes back.
        return lambda: answers_200(f"{run.public}/healthz") and answers_200(f"{run.public}/jupyter/hub/api/")
    if name == "hub":
        return lambda: answers_200(run.hub_api) and answers_200(f"{run.public}/jupyter/hub/api/")
    if name == "worker":
        return run.worker_answers
    if name in ("render", "estimate"):
        return lambda: worker_queues(run, name) == queues_of(run, name)
    return lambda: True  # beat, agent, console, revive: running again is all they show


def test_the_address_is_printed_only_once_it_answers(run: SupervisedRun) -> None:
    # Printed earlier, the first person to open it met the proxy's 503 for the seconds daphne took to start.
    assert run.answered_at_announcement, "the address was printed before it answered"


def test_the_worker_takes_eight_tasks_at_once(run: SupervisedRun) -> None:
    # Launches wait on the hub: eight people starting at once must reach it together, not two by two.
    from portal.celery import app

    run.wait(run.worker_answers, 60, "the Celery worker")
    stats = app.control.inspect(destination=[run.worker_name], timeout=2).stats() or {}
    pool = stats[run.worker_name]["pool"]
    assert pool["max-concurrency"] == 8
    assert pool["implementation"].startswith("celery.concurrency.thread")


def worker_queues(run: SupervisedRun, role: str) -> list[str]:
    """The queues the render or estimate worker reads, as it answers them (empty while it does not answer)."""
    from portal.celery import app

    name = f"{run.queue}-{role}@{socket.gethostname()}"
    found = app.control.inspect(destination=[name], timeout=1).active_queues() or {}
    return sorted(queue["name"] for queue in found.get(name, []))


def queues_of(run: SupervisedRun, role: str) -> list[str]:
    """What the worker should read: the estimate worker its queue; the render worker its queue and, once it
    has taken them, the render queue of each host of the (simulated) fleet, this machine standing in for all."""
    from django.conf import settings

    from sessions.gpus.backends.simulated import parse_fleet

    if role != "render":
        return [f"{run.queue}-{role}"]
    hosts = {gpu.host for gpu in parse_fleet(settings.SIMULATED_FLEET)}
    return sorted([f"{run.queue}-render", *(f"{run.queue}-render@{host}" for host in hosts)])


def pool_of(run: SupervisedRun, role: str) -> dict[str, Any]:
    from portal.celery import app

    name = f"{run.queue}-{role}@{socket.gethostname()}"
    return dict((app.control.inspect(destination=[name], timeout=2).stats() or {})[name]["pool"])


def test_render_jobs_have_a_worker_of_their_own_on_their_own_queue(run: SupervisedRun) -> None:
    from portal.celery import app

    run.wait(lambda: worker_queues(run, "render") == queues_of(run, "render"), 60, "the render worker, its hosts'")
    pool = pool_of(run, "render")
    assert pool["max-concurrency"] == len(os.sched_getaffinity(0))
    assert pool["implementation"].startswith("celery.concurrency.thread")
    # The portal's own worker does not read the render queue: a render never waits in front of its tasks.
    general = app.control.inspect(destination=[run.worker_name], timeout=2).active_queues() or {}
    assert [queue["name"] for queue in general[run.worker_name]] == [run.queue]


def test_estimates_have_a_lane_of_their_own_that_no_render_takes_a_thread_of(run: SupervisedRun) -> None:
    run.wait(lambda: worker_queues(run, "estimate") == queues_of(run, "estimate"), 60, "the estimate worker")
    pool = pool_of(run, "estimate")
    assert pool["max-concurrency"] == 2 and pool["implementation"].startswith("celery.concurrency.thread")
    assert worker_queues(run, "render") == queues_of(run, "render"), "the render worker never takes a probe"


@pytest.mark.parametrize("name", PORTAL + HELPERS)
def test_a_program_killed_with_sigkill_comes_back_and_the_others_keep_running(run: SupervisedRun, name: str) -> None:
    before = run.pids()
    os.kill(before[name], signal.SIGKILL)
    for check in still_answering(run, name):
        assert check(), f"something stopped answering while {name} was down"

    run.wait(lambda: run.pids()[name] not in (0, before[name]), 30, f"{name} started again")
    run.wait(back_again(run, name), 30, f"{name} answering again")

    after = run.pids()
    assert {other: pid for other, pid in after.items() if other != name} == {
        other: pid for other, pid in before.items() if other != name
    }
    # Nothing of the killed process lives on (a Celery worker's pool processes, say).
    run.wait(lambda: not group_members(before[name]), 10, f"the rest of {name}'s process group gone")


def test_a_program_that_keeps_failing_at_start_is_started_again_later(run: SupervisedRun) -> None:
    """daphne cannot bind its port: supervisord gives up on it (FATAL), the revive listener tries again."""
    supervisor = run.rpc().supervisor
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        supervisor.stopProcess("portal:web")
        squatter.bind(("127.0.0.1", run.ports["internal"]))
        squatter.listen()
        supervisor.startProcess("portal:web", False)
        run.wait(lambda: run.programs()["web"]["statename"] == "FATAL", 60, "web given up on")
    run.wait(lambda: run.programs()["web"]["statename"] == "RUNNING", 60, "web started again after FATAL")
    assert answers_200(f"{run.public}/healthz")


def test_every_program_is_running_at_the_end(run: SupervisedRun) -> None:
    assert {name: info["statename"] for name, info in run.programs().items()} == dict.fromkeys(
        PORTAL + HELPERS, "RUNNING"
    )


def test_a_run_after_a_crashed_supervisor_stops_what_it_left_and_starts_afresh(run: SupervisedRun) -> None:
    """Its pid file and socket are stale, its programs still hold the ports."""
    orphans = {pid for name, pid in run.pids().items() if name in PORTAL}
    run.crash()
    assert all(group_members(pid) for pid in orphans), "the programs should outlive a killed supervisord"
    run.start_again()
    run.ready(timeout=120)
    assert not any(group_members(pid) for pid in orphans)


def test_ctrl_c_stops_every_process_and_exits_0(run: SupervisedRun) -> None:
    run.programs()  # note the last pids: every process group this run ever had must end up empty
    assert run.interrupt(timeout=60) == 0
    run.wait_for(lambda: not run.left_behind(), 5, "every process of the run gone")


def test_when_the_reader_of_its_output_goes_away_the_run_stops_everything(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Ctrl-C on `make run | tee log` stops tee first; the portal must not run on without anyone watching."""
    piped = SupervisedRun(tmp_path_factory.mktemp("piped-run"), LOGS / "make-run-piped.log", piped=True)
    try:
        piped.ready(timeout=240)
        piped.programs()
        assert piped.process.stdout is not None
        piped.process.stdout.close()  # what tee's death does to the pipe
        answers_200(f"{piped.daphne}/healthz")  # a line for the console to write
        assert piped.process.wait(timeout=60) == 0
        piped.wait_for(lambda: not piped.left_behind(), 10, "every process of the run gone")
    finally:
        piped.clean_up()
