"""The simulated sampler follows what runs on each slice; frames and history keep people apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.backends import get_backend
from sessions.gpus.backends.simulated import SimulatedBackend
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu
from sessions.metrics import history
from sessions.metrics.frames import fleet_frame, load_holders, personal_frames
from sessions.metrics.models import GpuMinute

pytestmark = pytest.mark.django_db
NOW = 1_800_000_000.0


def backend() -> SimulatedBackend:
    found = get_backend()
    assert isinstance(found, SimulatedBackend)
    return found


def test_samples_follow_activity_and_repeat_for_the_same_second(make_fleet, alice: User) -> None:  # type: ignore[no-untyped-def]
    make_fleet("s: 1xH200:mig, 1xA100-80GB:mig, 1xL4:whole")
    h200 = allocate(alice, SliceRequest("mig", "3g.71gb", model="H200-SXM5-141GB"), holder=Holder.notebook(1))
    a100 = allocate(alice, SliceRequest("mig", "1g.10gb", model="A100-SXM4-80GB"), holder=Holder.notebook(2))
    busy = {h200.device_uuid: 0.9, a100.device_uuid: 0.9}
    first, again = backend().sample(busy, now=NOW), backend().sample(busy, now=NOW)
    assert first == again, "the same second gives the same figures"
    by_model = {gpu.model_name: gpu for gpu in first}
    hopper, ampere, l4 = by_model["H200-SXM5-141GB"], by_model["A100-SXM4-80GB"], by_model["L4-24GB"]
    assert hopper.utilization is None, "NVML has no whole-GPU utilisation while MIG is on"
    (device,) = hopper.devices
    assert device.uuid == h200.device_uuid and device.profile == "3g.71gb"
    assert device.utilization is not None and 85 <= device.utilization <= 100
    assert ampere.devices[0].utilization is None, "no GPM before Hopper: unavailable, not 0"
    assert l4.utilization == 0 and l4.memory_used_mib == 0 and l4.processes == 0, "nobody on it"
    idle = backend().sample({h200.device_uuid: 0.0}, now=NOW)
    idle_hopper = next(gpu for gpu in idle if gpu.uuid == hopper.uuid)
    assert idle_hopper.devices[0].utilization == 0
    assert idle_hopper.power_w is not None and hopper.power_w is not None and idle_hopper.power_w < hopper.power_w
    assert idle_hopper.temperature_c is not None and hopper.temperature_c is not None
    assert idle_hopper.temperature_c < hopper.temperature_c
    assert idle_hopper.devices[0].memory_used_mib < device.memory_used_mib


def test_a_persons_frame_holds_only_their_own_devices(make_fleet, alice: User, bob: User) -> None:  # type: ignore[no-untyped-def]
    make_fleet("s: 1xH200:mig, 1xA30:shared=2")
    mine = allocate(alice, SliceRequest("mig", "1g.18gb"), holder=Holder.notebook(7))
    theirs = allocate(bob, SliceRequest("mig", "2g.35gb"), holder=Holder.notebook(8))
    shared_a = allocate(alice, SliceRequest("shared"), holder=Holder.notebook(9))
    allocate(bob, SliceRequest("shared"), holder=Holder.notebook(10))
    holders = load_holders()
    samples = backend().sample({device: 0.5 for device in holders}, now=NOW)
    frame = fleet_frame("sim", NOW, samples, holders, {}, simulated=True)
    personal = personal_frames(frame, holders)
    alice_devices = {(d["uuid"], d["session"]) for d in personal[alice.pk]["devices"]}
    assert alice_devices == {(mine.device_uuid, 7), (shared_a.device_uuid, 9)}
    bob_devices = {(d["uuid"], d["session"]) for d in personal[bob.pk]["devices"]}
    assert (theirs.device_uuid, 8) in bob_devices and mine.device_uuid not in {u for u, _ in bob_devices}
    fleet_users = {u["user"] for gpu in frame["gpus"] for d in gpu["devices"] for u in d["users"]}
    assert fleet_users == {"alice", "bob"}


def test_minutes_keep_mean_and_max_per_device_and_holder(make_fleet, alice: User) -> None:  # type: ignore[no-untyped-def]
    make_fleet("s: 1xH200:mig")
    taken = allocate(alice, SliceRequest("mig", "1g.18gb"), holder=Holder.notebook(3))
    holders = load_holders()
    buffer = history.MinuteBuffer()
    start = datetime(2026, 11, 30, 10, 0, tzinfo=UTC).timestamp()
    rows: list[GpuMinute] = []
    for second, busy in enumerate([0.0, 1.0, 0.5] * 20 + [0.2]):  # 60 samples in 10:00, then one in 10:01
        samples = backend().sample({taken.device_uuid: busy}, now=start + second)
        rows += buffer.add(fleet_frame("sim", start + second, samples, holders, {}, True), holders)
    assert history.save(rows) == 2  # the GPU and its one MIG device
    device = GpuMinute.objects.get(device_uuid=taken.device_uuid)
    assert device.minute == datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert device.samples == 60 and device.session_id == 3 and device.owner_id == alice.pk
    assert device.util_max is not None and device.util_mean is not None
    assert 95 <= device.util_max <= 100 and 40 < device.util_mean < 60
    gpu = GpuMinute.objects.get(device_uuid=Gpu.objects.get().uuid)
    assert gpu.util_mean is None and gpu.util_max is None, "unreported stays unreported"
    assert gpu.power_max is not None and gpu.power_mean is not None and gpu.power_max > gpu.power_mean
    assert history.save(rows) == 0 or GpuMinute.objects.count() == 2, "a minute stored twice stays one row"
    assert [point["util"] for point in history.session_history(3)] == [device.util_mean]
    assert history.last_busy_minutes([3], 50.0) == {3: device.minute + timedelta(minutes=1)}
    assert history.last_busy_minutes([3], 101.0) == {}


def test_history_older_than_the_retention_is_deleted(alice: User) -> None:
    now = timezone.now().replace(second=0, microsecond=0)
    for age in (1, 40):
        GpuMinute.objects.create(minute=now - timedelta(days=age), host="h", gpu_uuid="G", device_uuid="G", samples=1)
    assert history.delete_older_than(30) == 1
    assert list(GpuMinute.objects.values_list("minute", flat=True)) == [now - timedelta(days=1)]


def test_the_fleet_frame_says_which_render_job_or_session_holds_a_device(make_fleet, alice: User) -> None:  # type: ignore[no-untyped-def]
    """From the slice's typed holder: a render job's id where a render job holds it, a session's where a session
    does, and the words the live tiles show."""
    make_fleet("s: 1xH200:mig")
    rendering = allocate(alice, SliceRequest("mig", "1g.18gb"), holder=Holder.render(5))
    notebook = allocate(alice, SliceRequest("mig", "2g.35gb"), holder=Holder.notebook(12))
    holders = load_holders()
    frame = fleet_frame("sim", NOW, backend().sample({}, now=NOW), holders, {}, simulated=True)
    users = {d["uuid"]: d["users"] for gpu in frame["gpus"] for d in gpu["devices"]}
    assert users[rendering.device_uuid] == [
        {"user": "alice", "session": None, "job": 5, "holder": "render:5", "label": "Render job #5"}
    ]
    assert users[notebook.device_uuid] == [
        {"user": "alice", "session": 12, "job": None, "holder": "notebook:12", "label": "Notebook session #12"}
    ]
