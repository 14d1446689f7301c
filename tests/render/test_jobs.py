"""A render job's states and who reaches it: steps only where the state allows them, each moment written
by its step; another person's job answers 404 on every page and action; staff see and filter all."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from sessions.render import jobs, services
from sessions.render.models import RenderJob
from tests.render import scenes
from tests.render.conftest import Upload as PostScene
from tests.render.conftest import stored, unpacked
from tests.render.leftovers import Traces, assert_left_as_found, traces

pytestmark = pytest.mark.django_db
State = RenderJob.State


def a_job(owner: User, state: State = State.VALIDATED, **fields: object) -> RenderJob:
    values: dict[str, object] = {
        "upload_name": "shot.blend",
        "folder": "nobody/none",
        "frame_spec": "1-3",
        "frames": [1, 2, 3],
        "frame_count": 3,
        "gpu_kind": "mig",
        "gpu_profile": "1g.18gb",
        "gpu_model": "H200-SXM5-141GB",
        "state": state,
    }
    values.update(fields)
    return RenderJob.objects.create(owner=owner, **values)


def test_a_job_walks_its_lifecycle_and_each_step_writes_its_moment(alice: User) -> None:
    job = a_job(alice)
    for step in (State.ESTIMATING, State.AWAITING_CONFIRMATION, State.QUEUED, State.RENDERING):
        job = jobs.move(job.pk, step)
    assert job.queued_at is not None and job.started_at is not None and job.finished_at is None
    first_queued = job.queued_at
    job = jobs.move(job.pk, State.FAILED, "Chunk 2 failed three times: Error: out of memory")
    assert job.finished_at is not None and job.failure_message.startswith("Chunk 2 failed")
    job = jobs.move(job.pk, State.QUEUED)  # its failed frames, again
    assert (job.finished_at, job.failure_message, job.queued_at) == (None, "", first_queued)
    job = jobs.move(jobs.move(job.pk, State.RENDERING).pk, State.DONE)
    job.refresh_from_db()
    assert job.state == State.DONE and job.finished_at is not None


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (State.UPLOADED, State.QUEUED),
        (State.VALIDATED, State.RENDERING),
        (State.AWAITING_CONFIRMATION, State.DONE),
        (State.DONE, State.CANCELLED),
        (State.CANCELLED, State.QUEUED),
        (State.DONE, State.QUEUED),
    ],
)
def test_a_step_the_state_does_not_allow_is_refused_and_changes_nothing(alice: User, start: State, to: State) -> None:
    job = a_job(alice, start)
    with pytest.raises(RenderJob.BadStep):
        jobs.move(job.pk, to)
    job.refresh_from_db()
    assert job.state == start


def test_every_state_is_reachable_from_an_upload_and_every_ended_one_is_final_or_requeued() -> None:
    reached, frontier = {State.UNPACKING.value}, [State.UNPACKING.value]
    while frontier:
        for following in RenderJob.NEXT[frontier.pop()]:
            if following not in reached:
                reached.add(following)
                frontier.append(following)
    assert reached == set(State.values)
    assert RenderJob.NEXT[State.DONE] == frozenset() and RenderJob.NEXT[State.CANCELLED] == frozenset()


def test_another_persons_job_answers_404_on_every_page_and_action(
    post_scene: PostScene, bob_client: Client, render_dir: Path
) -> None:
    post_scene("two.zip", scenes.zip_of(("a.blend", scenes.blend()), ("b.blend", scenes.blend())))
    job = RenderJob.objects.get()
    before = traces(render_dir)
    assert bob_client.get(reverse("render-job-detail", args=[job.pk])).status_code == 404
    assert bob_client.post(reverse("render-job-main-file", args=[job.pk]), {"main_file": "a.blend"}).status_code == 404
    for action in ("render-job-cancel", "render-job-confirm", "render-job-requeue-failed"):
        assert bob_client.post(reverse(action, args=[job.pk])).status_code == 404, action
    assert "two.zip" not in bob_client.get(reverse("render-job-list")).content.decode()
    assert_left_as_found(before, render_dir)  # still uploaded, its files in place, nothing allocated


def test_a_job_that_does_not_exist_answers_like_anothers(alice_client: Client) -> None:
    assert alice_client.get(reverse("render-job-detail", args=[999_999])).status_code == 404


def test_staff_see_everyones_jobs_and_filter_them_by_person_and_state(
    alice: User, bob: User, staff_client: Client
) -> None:
    a_job(alice, upload_name="alice-shot.blend")
    a_job(bob, State.DONE, upload_name="bob-done.blend")
    a_job(bob, State.FAILED, upload_name="bob-failed.blend")
    listed = reverse("render-job-list")
    everything = staff_client.get(listed).content.decode()
    assert all(name in everything for name in ("alice-shot.blend", "bob-done.blend", "bob-failed.blend"))
    just_bob = staff_client.get(listed, {"owner": "bob"}).content.decode()
    assert "alice-shot.blend" not in just_bob and "bob-done.blend" in just_bob
    bob_failed = staff_client.get(listed, {"owner": "bob", "state": "failed"}).content.decode()
    assert "bob-failed.blend" in bob_failed and "bob-done.blend" not in bob_failed
    job = RenderJob.objects.get(upload_name="alice-shot.blend")
    assert staff_client.get(reverse("render-job-detail", args=[job.pk])).status_code == 200


def test_a_job_waiting_for_confirmation_waits_for_its_owners_as_staff_see_it(
    alice: User, alice_client: Client, staff_client: Client
) -> None:
    job = a_job(alice, State.AWAITING_CONFIRMATION, gpu_kind="whole", gpu_profile="", gpu_model="A100-SXM4-80GB")
    pages = (reverse("render-job-list"), reverse("render-job-detail", args=[job.pk]))
    for page in pages:
        assert ">Waiting for your confirmation</span>" in alice_client.get(page).content.decode()
        assert ">Waiting for its owner&#x27;s confirmation</span>" in staff_client.get(page).content.decode()
    assert "A100-SXM4-80GB whole GPU · On-demand" in alice_client.get(pages[1]).content.decode()


def test_a_person_sees_only_their_own_jobs_and_no_filters(alice: User, bob: User, alice_client: Client) -> None:
    a_job(alice, upload_name="alice-shot.blend")
    a_job(bob, upload_name="bob-shot.blend")
    page = alice_client.get(reverse("render-job-list"), {"owner": "bob"}).content.decode()
    assert "alice-shot.blend" in page and "bob-shot.blend" not in page
    assert "Filter render jobs" not in page


def test_cancelling_a_job_before_its_estimate_removes_its_files(
    post_scene: PostScene, alice_client: Client, render_dir: Path
) -> None:
    post_scene("two.zip", scenes.zip_of(("a.blend", scenes.blend()), ("b.blend", scenes.blend())))
    job = unpacked(RenderJob.objects.get())
    assert job.state == State.UPLOADED and stored(render_dir) != []
    assert alice_client.post(reverse("render-job-cancel", args=[job.pk])).status_code == 302
    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.finished_at is not None
    assert stored(render_dir) == []


@pytest.mark.parametrize(
    ("state", "words"),
    [(State.DONE, "already done"), (State.FAILED, "already failed"), (State.CANCELLED, "already cancelled")],
)
def test_a_cancel_of_a_finished_job_is_refused_and_changes_nothing(
    alice: User, alice_client: Client, render_dir: Path, state: State, words: str
) -> None:
    job = a_job(alice, state, folder="t1/finished", queued_at=timezone.now(), finished_at=timezone.now())
    (job.folder_path() / "frames").mkdir(parents=True)
    (job.folder_path() / "frames" / "frame_000001.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    before = traces(render_dir)
    answer = alice_client.post(reverse("render-job-cancel", args=[job.pk]))
    assert answer.status_code == 409 and f"This job is {words}." in answer.content.decode()
    assert_left_as_found(before, render_dir)  # its frames kept, its state as it was, nothing allocated


def test_a_running_job_is_not_cancelled_by_the_before_queue_path(alice: User) -> None:
    job = a_job(alice, State.RENDERING)
    with pytest.raises(RenderJob.BadStep) as refused:
        jobs.cancel_before_queue(job.pk)
    assert "cannot be cancelled here yet" in str(refused.value)


def test_a_folder_an_upload_left_when_it_died_is_removed_once_long_untouched(
    post_scene: PostScene, render_dir: Path
) -> None:
    import os
    import time

    post_scene("kept.blend", scenes.blend())
    job = RenderJob.objects.get()
    owner = job.folder_path().parent
    dead, fresh = owner / ("d" * 32), owner / ("f" * 32)
    for folder in (dead, fresh):
        (folder / "scene").mkdir(parents=True)
        (folder / "scene" / "scene.blend").write_bytes(b"BLENDER-v304 cut off")
    a_day_ago = time.time() - 86_400
    for path in (
        dead,
        dead / "scene",
        dead / "scene" / "scene.blend",
        job.folder_path(),
        *job.folder_path().rglob("*"),
    ):
        os.utime(path, (a_day_ago, a_day_ago))
    assert jobs.remove_orphan_folders() == 1
    assert not dead.exists() and fresh.exists()  # an upload may still be streaming into the fresh one
    assert job.scene_path().joinpath("scene.blend").exists()  # a job's folder stays however old


def test_a_job_whose_estimate_fails_keeps_its_row_and_words_but_not_its_scene(
    post_scene: PostScene, render_dir: Path, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    post_scene("a.blend", scenes.blend())
    job = unpacked(RenderJob.objects.get())
    assert job.state == State.ESTIMATING and stored(render_dir) != []
    with django_capture_on_commit_callbacks(execute=True):
        services.no_slice_for_probe(job.pk, "every H200 slice is taken")
    job.refresh_from_db()
    assert job.failure_message == "No slice was free for the estimate: every H200 slice is taken"
    # It can never render (re-queueing needs rendered frames): nothing of it stays on disk or allocated.
    assert traces(render_dir) == Traces(
        files=(), jobs=((job.pk, State.FAILED),), uploads=(), storage=(), held_slices=(), containers=None
    )
