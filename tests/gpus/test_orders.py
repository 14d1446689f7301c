"""Only a host's agent changes its GPUs (issue 31): every MIG instance made or destroyed is an order that the
agent of its host (``manage.py gpu_agent``, here a real process) claims, carries out once and records; a launch
waits for it with a deadline and fails at once when the host's heartbeat is stale.

The test process is the agent of every simulated host elsewhere in the suite (tests/conftest.py); here it steps
out of that role, as a web process or a worker is.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction

from sessions.gpus import agency, orders, statements
from sessions.gpus.allocator import SliceRequest, allocate, release
from sessions.gpus.backends import BackendError, get_backend
from sessions.gpus.catalog import model
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, HostOrder, SimulatedGpuInstance, Slice
from sessions.gpus.placement import Layout
from tests.conftest import ARTIFACTS
from tests.gpus.conftest import use_fleet
from tests.helpers import processes

pytestmark = pytest.mark.django_db(transaction=True)
FLEET = "ord: 1xH200:mig"
H200 = model("H200-SXM5-141GB")
Order = HostOrder.State


@pytest.fixture
def gpu(settings) -> Gpu:  # type: ignore[no-untyped-def]
    settings.HOST_HEARTBEAT_S = 1  # as the agent below beats: stale after three silent seconds
    [found] = use_fleet(settings, FLEET)  # discovery, as this host's agent
    return found


@pytest.fixture
def not_the_agent(gpu: Gpu) -> Iterator[None]:
    """This process is a web process or a worker from here on: it is no host's agent."""
    agency.stop_acting_for([agency.EVERY_HOST])
    yield
    agency.act_for([agency.EVERY_HOST])


def start_agent(name: str) -> subprocess.Popen[bytes]:
    return processes.start_gpu_agent(FLEET, ARTIFACTS / "logs" / f"gpu-agent-{name}.log", PORTAL_HOST_HEARTBEAT_S="1")


@pytest.fixture
def agent(not_the_agent: None) -> Iterator[subprocess.Popen[bytes]]:
    process = start_agent("orders")
    yield process
    processes.stop(process)


def launched(owner: User, profile: str = "3g.71gb") -> Slice:
    """A launch's allocation, committed, as a web process makes it."""
    with transaction.atomic():
        return allocate(owner, SliceRequest("mig", profile))


def on_device(gpu: Gpu) -> list[tuple[str, int]]:
    return list(SimulatedGpuInstance.objects.filter(gpu_uuid=gpu.uuid).values_list("profile", "start"))


def test_a_process_that_is_not_the_hosts_agent_cannot_change_its_gpus(
    gpu: Gpu, not_the_agent: None, suite_agent_stopped: None
) -> None:
    """(The suite's executor is stopped: while this test briefly acts for "ord" to make an instance, it would
    carry out the pending create, which a web process's order must not see done.)"""
    backend = get_backend()
    with pytest.raises(BackendError, match="only the agent of host ord changes its GPUs") as refused:
        backend.create_instance(gpu.uuid, H200.profile("3g.71gb"), 4)
    assert refused.value.code == "not_agent"
    taken = launched(User.objects.create_user("web"))  # the allocation decides and records, and that is all
    assert on_device(gpu) == []
    assert (taken.device_uuid, taken.instance_id) == ("", None)
    order = HostOrder.objects.get(slice=taken)
    assert (order.action, order.state, order.profile) == ("create", Order.PENDING, "3g.71gb")
    assert order.start == taken.placement_start
    with agency.acting_for(["ord"]):  # made by the agent, so that a non-agent can be refused its destroy
        made = backend.create_instance(gpu.uuid, H200.profile("1g.18gb"), 6)
    with pytest.raises(BackendError, match="only the agent of host ord changes its GPUs"):
        backend.destroy_instance(gpu.uuid, made.gi_id)
    assert on_device(gpu) == [("1g.18gb", 6)]


def test_the_agent_makes_and_destroys_what_launches_and_releases_order(
    gpu: Gpu, agent: subprocess.Popen[bytes]
) -> None:
    owner = User.objects.create_user("launcher")
    taken = launched(owner)
    started = time.monotonic()
    orders.wait_for_slice(taken.pk, deadline_s=20)
    taken.refresh_from_db()
    assert time.monotonic() - started < 5  # woken by the order's notice, not by a slow poll
    assert on_device(gpu) == [("3g.71gb", taken.placement_start)]
    instance = GpuInstance.objects.get(slices=taken)
    assert (instance.profile, instance.start) == ("3g.71gb", taken.placement_start)
    assert taken.device_uuid == instance.device_uuid
    assert taken.device_uuid.startswith("MIG-")
    release(taken.pk)
    destroy = HostOrder.objects.get(action="destroy", gpu=gpu)
    assert orders.wait(destroy.pk, deadline_s=20).gi_id == instance.gi_id
    assert on_device(gpu) == []
    assert not GpuInstance.objects.filter(gpu=gpu).exists()


def test_an_order_is_announced_to_listening_agents_once_it_commits_and_not_before(
    gpu: Gpu, not_the_agent: None
) -> None:
    """The notice that wakes an agent (``LISTEN gpu_host_orders``) comes from the recording process just after
    the commit: an agent woken before it would find nothing, and one never woken would look only every second."""
    listener = orders._listener()
    if listener is None:
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite's agent looks every 0.2 s")
    try:
        with transaction.atomic():
            taken = allocate(User.objects.create_user("web"), SliceRequest("mig", "3g.71gb"))
            assert list(listener.notifies(timeout=0.5, stop_after=1)) == [], "nothing is announced before the commit"
        [notice] = list(listener.notifies(timeout=10, stop_after=1))
        assert notice.channel == orders.CHANNEL
        assert HostOrder.objects.get(slice=taken).state == Order.PENDING, "the order is there when it is announced"
        release(taken.pk)
        assert len(list(listener.notifies(timeout=10, stop_after=1))) == 1, "its destroy is announced too"
    finally:
        listener.close()


def test_an_order_whose_notice_never_came_is_carried_out_at_the_agents_look_each_second(
    gpu: Gpu, agent: subprocess.Popen[bytes]
) -> None:
    """A woken agent takes as many orders as it heard notices of; one recorded without a notice (lost in a
    crash, say) is found by its look each second."""
    launched_one = launched(User.objects.create_user("web"), "1g.18gb")  # announced: the agent is up and listening
    orders.wait_for_slice(launched_one.pk, deadline_s=20)
    release(launched_one.pk)
    orders.wait(HostOrder.objects.get(action="destroy", gpu=gpu).pk, deadline_s=20)  # the GPU idle again
    silent = HostOrder.objects.create(
        host=gpu.host, gpu=gpu, action=HostOrder.Action.LAYOUT, layout=[["3g.71gb", 4]]
    )  # recorded as no process records one: no notice follows
    done = orders.wait(silent.pk, deadline_s=20)
    assert done.state == Order.DONE
    assert on_device(gpu) == [("3g.71gb", 4)]


def test_a_release_that_waited_for_the_agent_recording_the_instance_takes_that_instance_with_it(
    gpu: Gpu, not_the_agent: None, suite_agent_stopped: None
) -> None:
    """The agent records a slice's instance while the slice is released: the release waits for the agent's
    lock, and must then see the instance the agent recorded (made after the release's statement began), delete
    its row and have it destroyed, or the GPU's bookkeeping keeps an instance nobody holds."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's; SQLite runs one writing transaction at a time")
    taken = launched(User.objects.create_user("web"))
    create = HostOrder.objects.get(slice=taken)
    recorded, go_on = threading.Event(), threading.Event()

    def agent() -> None:  # carries the create out and holds its transaction open (the slice locked) until told
        try:
            # It stops acting before it commits, as an agent's order ends before its lock goes: the release, let
            # go by that commit, must not find this process the agent and carry its own order out (a race).
            with transaction.atomic(), agency.acting_for(["ord"]):
                assert orders.carry_out(create.pk)
                recorded.set()
                go_on.wait(20)
        finally:
            connection.close()

    def releasing() -> None:
        try:
            release(taken.pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=agent), threading.Thread(target=releasing)]
    threads[0].start()
    assert recorded.wait(20)
    threads[1].start()
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    give_up = time.monotonic() + 20
    while statements.rows(waiting)[0][0] == 0 and time.monotonic() < give_up:
        time.sleep(0.05)
    assert statements.rows(waiting)[0][0] == 1, "the release waits for the agent's lock on the slice"
    go_on.set()
    for thread in threads:
        thread.join(20)
    with agency.acting_for(["ord"]):
        while orders.carry_out_next(["ord"]):
            pass

    assert not GpuInstance.objects.filter(gpu=gpu).exists(), "no instance row is left without its slice"
    assert on_device(gpu) == [], "and the device's instance is destroyed"
    gpu.refresh_from_db()
    recorded_books = (gpu.layout(), gpu.active_slices)
    orders.recount(gpu)
    assert (gpu.layout(), gpu.active_slices) == recorded_books == (Layout(), 0)


def test_an_order_recorded_in_the_agents_own_process_waits_for_the_earlier_orders_of_its_gpu(
    gpu: Gpu, not_the_agent: None
) -> None:
    """One GPU's orders run in the order they were decided, also when the later one is recorded in the agent's
    own process (carried out at once there, unless an earlier order of its GPU still waits)."""
    owner = User.objects.create_user("both")
    first = launched(owner, "3g.71gb")  # recorded by a web process: it waits for the agent
    with agency.acting_for(["ord"]):  # this process's executor is now the agent of "ord"
        second = launched(owner, "1g.18gb")
        orders.wait_for_slice(second.pk, deadline_s=20)
        orders.wait_for_slice(first.pk, deadline_s=20)
    done = dict(HostOrder.objects.filter(action="create").values_list("slice_id", "done_at"))
    first_done, second_done = done[first.pk], done[second.pk]
    assert first_done is not None and second_done is not None
    assert first_done <= second_done, "the earlier order first"
    assert sorted(on_device(gpu)) == sorted([("3g.71gb", first.placement_start), ("1g.18gb", second.placement_start)])


def test_a_launch_on_a_host_whose_agent_stopped_fails_within_the_deadline_with_the_reason(
    gpu: Gpu, agent: subprocess.Popen[bytes]
) -> None:
    processes.stop(agent)
    taken = launched(User.objects.create_user("late"))
    started = time.monotonic()
    with pytest.raises(orders.OrderFailed, match=r"The agent of GPU host ord has been silent for \d+ s"):
        orders.wait_for_slice(taken.pk, deadline_s=30)
    assert time.monotonic() - started < 10  # the stale heartbeat, not the 30 s deadline
    order = HostOrder.objects.get(slice=taken)
    assert order.state == Order.CANCELLED
    release(taken.pk)  # what the launch does next: the room is free again at once
    assert Gpu.objects.get(pk=gpu.pk).compute_used == 0
    back = start_agent("back")  # the agent back: the cancelled create is never made, the destroy finds nothing
    try:
        destroy = HostOrder.objects.get(action="destroy", gpu=gpu)
        assert orders.wait(destroy.pk, deadline_s=20).gi_id is None
    finally:
        processes.stop(back)
    assert on_device(gpu) == []
    assert HostOrder.objects.get(pk=order.pk).state == Order.CANCELLED


def test_a_launch_on_a_host_no_agent_ever_served_fails_at_the_deadline(gpu: Gpu, not_the_agent: None) -> None:
    assert GpuHost.objects.get(name="ord").heartbeat_at is None
    taken = launched(User.objects.create_user("nobody"))
    started = time.monotonic()
    with pytest.raises(orders.OrderFailed, match="The agent of GPU host ord did not make the slice within 2 s"):
        orders.wait_for_slice(taken.pk, deadline_s=2)
    assert 2 <= time.monotonic() - started < 6
    assert HostOrder.objects.get(slice=taken).state == Order.CANCELLED


def test_an_order_retried_after_the_agent_died_makes_one_instance(gpu: Gpu, not_the_agent: None) -> None:
    """An agent that made the instance and died before recording it (the driver keeps what it made, the
    transaction that was to record it never commits) leaves the order pending; the next agent adopts the
    instance it finds at the order's placement instead of making a second."""
    taken = launched(User.objects.create_user("crash"))
    with agency.acting_for(["ord"]):  # what the first agent did on the device before it died
        first = get_backend().create_instance(gpu.uuid, H200.profile("3g.71gb"), taken.placement_start or 0)
    assert HostOrder.objects.get(slice=taken).state == Order.PENDING
    again = start_agent("retry")
    try:
        orders.wait_for_slice(taken.pk, deadline_s=20)
    finally:
        processes.stop(again)
    taken.refresh_from_db()
    assert on_device(gpu) == [("3g.71gb", taken.placement_start)]
    assert SimulatedGpuInstance.objects.get(gpu_uuid=gpu.uuid).gi_id == first.gi_id
    assert taken.device_uuid == first.device_uuid
    order = HostOrder.objects.get(slice=taken)
    assert (order.state, order.gi_id, order.device_uuid) == (Order.DONE, first.gi_id, first.device_uuid)


def test_a_create_the_device_refuses_fails_the_launch_with_the_devices_reason(gpu: Gpu) -> None:
    """The allocator's books and the device disagree (an instance made by hand where the allocator puts the
    slice): the order fails, saying what the device holds, and the launch gets that reason."""
    get_backend().create_instance(gpu.uuid, H200.profile("1g.18gb"), 0)  # by hand (this process is the agent)
    agency.stop_acting_for([agency.EVERY_HOST])
    try:
        taken = launched(User.objects.create_user("clash"))  # first-fit on books that say empty: slice 0
    finally:
        agency.act_for([agency.EVERY_HOST])  # this process's agent carries the order out
    assert taken.placement_start == 0
    with pytest.raises(orders.OrderFailed, match="memory slice 0 holds a 1g.18gb instance already"):
        orders.wait_for_slice(taken.pk, deadline_s=10)
    assert HostOrder.objects.get(slice=taken).state == Order.FAILED


def test_a_burst_of_orders_is_carried_out_a_batch_to_a_transaction(
    gpu: Gpu,
    not_the_agent: None,
    suite_agent_stopped: None,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    """Orders that wait together are carried out up to ``most`` at a time, each batch in one transaction (its
    rows share the transaction id that wrote them), in the order they were decided. The suite's executor is
    stopped: it acts for the hosts this process acts for, and once raced the test for the burst ("ord")."""
    settings.MAX_SLICES_PER_USER = 5
    owner = User.objects.create_user("burst")
    taken = [launched(owner, "1g.18gb") for _ in range(5)]
    with agency.acting_for(["ord"]):
        assert orders.carry_out_some(["ord"], most=3) == 3
        assert HostOrder.objects.filter(state=Order.PENDING).count() == 2
        assert orders.carry_out_some(["ord"], most=3) == 2
        assert orders.carry_out_some(["ord"], most=3) == 0
    assert sorted(on_device(gpu)) == sorted(("1g.18gb", one.placement_start) for one in taken)
    ids = [HostOrder.objects.get(slice=one, action="create").pk for one in taken]
    assert all(HostOrder.objects.get(pk=pk).state == Order.DONE for pk in ids)
    if connection.vendor == "postgresql":
        written = dict(statements.rows("SELECT id, xmin::text FROM gpus_hostorder WHERE id = ANY(%s)", [ids]))
        assert len({written[pk] for pk in ids[:3]}) == 1 and len({written[pk] for pk in ids[3:]}) == 1
        assert written[ids[0]] != written[ids[3]]
