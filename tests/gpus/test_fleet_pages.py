"""The operators' fleet pages: the overview, one GPU's slice picture, and the forms that change a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from sessions.gpus.allocator import SliceRequest, allocate
from sessions.gpus.holders import Holder
from sessions.gpus.models import Gpu, GpuHost, GpuInstance, Slice
from sessions.render.models import RenderJob

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "gpu-detail"}


@pytest.fixture
def operator(staff: User) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def detail_url(gpu: Gpu) -> str:
    return reverse("fleet-gpu", kwargs={"gpu_id": gpu.pk})


def change_url(gpu: Gpu, what: str) -> str:
    return reverse(f"fleet-gpu-{what}", kwargs={"gpu_id": gpu.pk})


def blocks(page: str) -> list[str]:
    """The text of each block in the MIG picture, whitespace squeezed."""
    found = re.findall(r'<div class="mig-block [^"]*"[^>]*>(.*?)</div>', page, flags=re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", block).split()) for block in found]


def instances(gpu: Gpu) -> list[tuple[str, int]]:
    return list(GpuInstance.objects.filter(gpu=gpu).order_by("start").values_list("profile", "start"))


def test_the_fleet_page_lists_every_gpu_and_marks_simulated_ones(h200s: list[Gpu], operator: Client) -> None:
    page = operator.get(reverse("fleet")).content.decode()
    assert "<h2 id=" in page and "sim-1</h2>" in page
    for gpu in h200s:
        assert f'href="{detail_url(gpu)}"' in page
        assert f'title="{gpu.uuid}"' in page
    assert page.count(">Simulated</span>") == 1 + len(h200s)  # the host and each of its GPUs
    assert "H200-SXM5-141GB" in page and "A100-SXM4-80GB" in page and "A30-24GB" in page
    assert "0 of 3 shares" in page


def test_the_fleet_page_lists_a_hosts_gpus_in_index_order(
    h200s: list[Gpu], many_slices: User, operator: Client
) -> None:
    allocate(many_slices, SliceRequest(kind="mig", profile="1g.18gb"))  # counting slices must not reorder the rows
    page = operator.get(reverse("fleet")).content.decode()
    by_index = sorted(h200s, key=lambda gpu: gpu.index)
    assert [page.index(f'href="{detail_url(gpu)}"') for gpu in by_index] == sorted(
        page.index(f'href="{detail_url(gpu)}"') for gpu in h200s
    )


def test_a_time_sliced_gpu_says_its_shares_have_no_memory_isolation(h200s: list[Gpu], operator: Client) -> None:
    shared = next(gpu for gpu in h200s if gpu.sharing == Gpu.Sharing.SHARED)
    assert "no memory isolation" in operator.get(reverse("fleet")).content.decode()
    assert "no memory isolation" in operator.get(detail_url(shared)).content.decode()


def test_a_missing_gpu_shows_its_state_and_why(h200s: list[Gpu], operator: Client) -> None:
    Gpu.objects.filter(pk=h200s[2].pk).update(state=Gpu.State.MISSING, state_detail="Not found at the last discovery.")
    page = operator.get(reverse("fleet")).content.decode()
    assert ">missing</span>" in page
    assert "Not found at the last discovery." in page


def test_a_user_gets_403_and_an_anonymous_visitor_goes_to_log_in(h200s: list[Gpu], alice: User) -> None:
    user = Client()
    user.force_login(alice)
    urls = [reverse("fleet"), detail_url(h200s[0])]
    for url in urls:
        assert user.get(url).status_code == 403
        response = Client().get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    response = user.post(change_url(h200s[0], "policy"), {"policy": "static"})
    assert response.status_code == 403
    assert Gpu.objects.get(pk=h200s[0].pk).mig_policy == Gpu.Policy.DYNAMIC


def test_the_picture_shows_a_block_per_instance_with_its_profile_and_owner(
    h200s: list[Gpu], many_slices: User, operator: Client
) -> None:
    taken = allocate(many_slices, SliceRequest(kind="mig", profile="3g.71gb"), holder=Holder.notebook(7))
    page = operator.get(detail_url(taken.gpu)).content.decode()
    start = taken.placement_start
    assert start is not None
    end = start + 3
    assert f"col-{start + 1} span-4" in page  # classes, not style="": the CSP allows no inline style
    assert blocks(page).count("3g.71gb alice Notebook session #7") == 1
    assert blocks(page).count("free") == 4  # the other half of the GPU, one cell per memory slice
    assert f"<td>{start} to {end}</td>" in page  # the table that describes the picture to screen readers
    assert "Compute slices used: 3 of 7" in page
    assert 'value="3"' in page
    assert taken.device_uuid in page


def a_render_job(owner: User, tmp_path: Path, settings) -> RenderJob:  # type: ignore[no-untyped-def]
    settings.RENDER_DIR = tmp_path
    job = RenderJob.objects.create(
        owner=owner, state=RenderJob.State.RENDERING, upload_name="shot.blend", folder="t/f", main_file="scene.blend",
        frame_spec="1-3", frames=[1, 2, 3], frame_count=3, gpu_kind="mig", gpu_profile="1g.18gb",
        gpu_model="H200-SXM5-141GB", queued_at=timezone.now(),
    )  # fmt: skip
    return job


def holder_cells(page: str) -> list[str]:
    """Each holder link on the page, as ``href|text``."""
    links = re.findall(r'<a href="([^"]+)" data-testid="slice-holder">([^<]*)</a>', page)
    return [f"{href}|{text}" for href, text in links]


def test_a_render_jobs_slice_shows_the_job_with_a_link_to_its_page_as_a_sessions_does(
    h200s: list[Gpu],
    many_slices: User,
    operator: Client,
    tmp_path: Path,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    job = a_render_job(many_slices, tmp_path, settings)
    rendering = allocate(many_slices, SliceRequest(kind="mig", profile="1g.18gb"), holder=Holder.render(job.pk))
    notebook = allocate(many_slices, SliceRequest(kind="mig", profile="2g.35gb"), holder=Holder.notebook(7))
    gpus = {rendering.gpu_id: rendering.gpu, notebook.gpu_id: notebook.gpu}.values()
    page = "".join(operator.get(detail_url(gpu)).content.decode() for gpu in gpus)

    job_url = reverse("render-job-detail", args=[job.pk])
    assert blocks(page).count(f"1g.18gb alice Render job #{job.pk}") == 1
    assert blocks(page).count("2g.35gb alice Notebook session #7") == 1
    # The screen readers' table and the active slices' table each link the holder.
    assert holder_cells(page).count(f"{job_url}|Render job #{job.pk}") == 2
    assert holder_cells(page).count(f"{reverse('session-detail', args=[7])}|Notebook session #7") == 2
    assert "render:" not in page and "notebook:" not in page  # no names to parse, for people or tests
    # The link leads staff to the job's page.
    followed = operator.get(job_url)
    assert followed.status_code == 200
    assert f"Render job {job.pk} of alice" in followed.content.decode()


def test_a_slice_that_no_one_holds_says_so(h200s: list[Gpu], many_slices: User, operator: Client) -> None:
    taken = allocate(many_slices, SliceRequest(kind="mig", profile="1g.18gb"))
    page = operator.get(detail_url(taken.gpu)).content.decode()
    assert blocks(page).count("1g.18gb alice no holder") == 1
    assert holder_cells(page) == []


def test_how_many_more_fit_comes_from_the_allocator(h200s: list[Gpu], many_slices: User, operator: Client) -> None:
    taken = allocate(many_slices, SliceRequest(kind="mig", profile="3g.71gb"))  # first-fit: at slice 0
    assert taken.placement_start == 0
    page = operator.get(detail_url(taken.gpu)).content.decode()
    assert re.search(r'<th scope="row">3g.71gb</th>[^\n]*<strong>1</strong>', page)
    assert re.search(r'<th scope="row">7g.141gb</th>[^\n]*<strong>0</strong>', page)
    assert re.search(r'<th scope="row">1g.18gb</th>[^\n]*<strong>3</strong>', page)  # at 4, 5 and 6


def test_a_preset_layout_is_applied_after_switching_to_static(h200s: list[Gpu], operator: Client) -> None:
    gpu = h200s[0]
    response = operator.post(change_url(gpu, "policy"), {"policy": "static"}, follow=True)
    assert "The MIG policy is now static layout." in response.content.decode()
    response = operator.post(change_url(gpu, "layout"), {"preset": "all-balanced", "layout_text": ""})
    assert response.status_code == 302
    assert response["Location"] == detail_url(gpu)
    assert instances(gpu) == [("2g.35gb", 0), ("1g.18gb", 2), ("1g.18gb", 3), ("3g.71gb", 4)]
    page = operator.get(detail_url(gpu)).content.decode()
    assert "Layout applied: 2g.35gb@0, 1g.18gb@2, 1g.18gb@3, 3g.71gb@4." in page
    assert blocks(page) == [
        "2g.35gb ready, unused",
        "1g.18gb ready, unused",
        "1g.18gb ready, unused",
        "3g.71gb ready, unused",
    ]


def test_a_custom_layout_is_parsed_and_applied(h200s: list[Gpu], operator: Client) -> None:
    gpu = h200s[0]
    operator.post(change_url(gpu, "policy"), {"policy": "static"})
    operator.post(change_url(gpu, "layout"), {"layout_text": "3g.71gb@4, 2g.35gb@0, 1g.18gb@2"})
    assert instances(gpu) == [("2g.35gb", 0), ("1g.18gb", 2), ("3g.71gb", 4)]


def test_an_overlapping_custom_layout_is_refused_with_the_reason_and_nothing_changes(
    h200s: list[Gpu], operator: Client
) -> None:
    gpu = h200s[0]
    operator.post(change_url(gpu, "policy"), {"policy": "static"})
    operator.post(change_url(gpu, "layout"), {"preset": "all-3g"})
    before = instances(gpu)
    response = operator.post(change_url(gpu, "layout"), {"layout_text": "3g.71gb@0, 2g.35gb@2"})
    page = response.content.decode()
    assert response.status_code == 200
    assert "Nothing was changed." in page
    assert "2g.35gb at 2 needs memory slices 2-3, and some are taken." in page
    assert 'value="3g.71gb@0, 2g.35gb@2"' in page  # the operator's text stays in the form to fix
    assert instances(gpu) == before == [("3g.71gb", 0), ("3g.71gb", 4)]


def test_a_layout_that_does_not_parse_says_what_is_wrong(h200s: list[Gpu], operator: Client) -> None:
    gpu = h200s[0]
    operator.post(change_url(gpu, "policy"), {"policy": "static"})
    page = operator.post(change_url(gpu, "layout"), {"layout_text": "3g.71gb"}).content.decode()
    assert "&#x27;3g.71gb&#x27; is not PROFILE@START, e.g. 3g.71gb@4" in page
    assert instances(gpu) == []


def test_a_layout_is_refused_on_a_dynamic_gpu(h200s: list[Gpu], operator: Client) -> None:
    page = operator.post(change_url(h200s[0], "layout"), {"preset": "all-7g"}).content.decode()
    assert "Layouts apply to MIG GPUs with the static policy; switch the policy first." in page
    assert instances(h200s[0]) == []


def test_a_layout_the_backend_cannot_make_is_refused_with_its_reason(h200s: list[Gpu], operator: Client) -> None:
    gpu = h200s[0]
    operator.post(change_url(gpu, "policy"), {"policy": "static"})
    GpuHost.objects.filter(pk=gpu.host_id).update(backend=GpuHost.Backend.NVML)  # a host this process cannot reach
    page = operator.post(change_url(gpu, "layout"), {"preset": "all-7g"}).content.decode()
    assert "this process runs the simulated backend and cannot manage a nvml host" in page
    assert instances(gpu) == []


def test_the_policy_cannot_be_switched_while_a_slice_is_in_use(
    h200s: list[Gpu], many_slices: User, operator: Client
) -> None:
    taken = allocate(many_slices, SliceRequest(kind="mig", profile="3g.71gb"))
    page = operator.post(change_url(taken.gpu, "policy"), {"policy": "static"}).content.decode()
    assert "1 slice(s) on this GPU are in use; change it once they have ended." in page
    assert Gpu.objects.get(pk=taken.gpu_id).mig_policy == Gpu.Policy.DYNAMIC
    assert Slice.objects.get(pk=taken.pk).active


def test_a_time_sliced_gpu_takes_a_new_share_limit_and_refuses_a_bad_one(h200s: list[Gpu], operator: Client) -> None:
    shared = next(gpu for gpu in h200s if gpu.sharing == Gpu.Sharing.SHARED)
    operator.post(change_url(shared, "sharing"), {"sharing": "shared", "share_limit": "6"})
    assert Gpu.objects.get(pk=shared.pk).share_limit == 6
    page = operator.post(change_url(shared, "sharing"), {"sharing": "shared", "share_limit": "1"}).content.decode()
    assert "A time-sliced GPU takes 2 to 64 sessions." in page
    assert Gpu.objects.get(pk=shared.pk).share_limit == 6


def test_a_whole_gpu_can_become_time_sliced(h200s: list[Gpu], operator: Client) -> None:
    whole = next(gpu for gpu in h200s if gpu.sharing == Gpu.Sharing.WHOLE)
    response = operator.post(change_url(whole, "sharing"), {"sharing": "shared", "share_limit": "4"}, follow=True)
    assert "Now time-sliced: up to 4 sessions at once." in response.content.decode()
    assert Gpu.objects.get(pk=whole.pk).sharing == Gpu.Sharing.SHARED


def test_an_htmx_request_gets_only_the_gpu_region(h200s: list[Gpu], operator: Client) -> None:
    gpu = h200s[0]
    page = operator.get(detail_url(gpu), **HTMX).content.decode()  # type: ignore[arg-type]
    assert "<html" not in page
    assert 'class="mig-map slices-8"' in page
    response = operator.post(change_url(gpu, "policy"), {"policy": "static"}, **HTMX)  # type: ignore[arg-type]
    page = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in page
    assert "The MIG policy is now static layout." in page
    refused = operator.post(change_url(gpu, "layout"), {"layout_text": "3g.71gb@1"}, **HTMX)  # type: ignore[arg-type]
    assert "<html" not in refused.content.decode()
    assert "3g.71gb cannot start at memory slice 1; it may start at 0, 4." in refused.content.decode()


def test_an_htmx_poll_of_the_fleet_gets_only_the_hosts(h200s: list[Gpu], operator: Client) -> None:
    page = operator.get(reverse("fleet"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="fleet-hosts").content.decode()
    assert "<html" not in page
    assert 'id="fleet-hosts"' in page
