"""What a refused render action could leave behind, taken in one look: the files under the render folder,
the render jobs and their states, the uploads not yet jobs, what counts toward people's storage quotas, the
slices not released, and (where the test has the Docker engine) this portal's render containers. Bad input
must leave every one of them as it found them:

    before = traces(render_dir)
    ... the bad upload, the other person's request, the cancel of a finished job ...
    assert_left_as_found(before, render_dir)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from sessions.gpus.models import Slice
from sessions.render.models import RenderJob, RenderUpload
from sessions.runtime.docker import DockerRuntime
from sessions.runtime.render import PURPOSE_LABEL
from sessions.runtime.spec import LABEL_PREFIX
from sessions.storage.models import StorageUse


@dataclass(frozen=True)
class Traces:
    files: tuple[str, ...]  # everything under the render folder, relative to it
    jobs: tuple[tuple[int, str], ...]  # every render job and its state
    uploads: tuple[str, ...]  # every upload not (yet) a job
    storage: tuple[tuple[str, str, int], ...]  # what counts toward a quota: each thing's kind, key and bytes
    held_slices: tuple[tuple[int, str], ...]  # every slice not released, with its holder
    containers: tuple[str, ...] | None  # this portal's render containers, running or not; None: not looked

    def differences(self, after: Traces) -> list[str]:
        return [
            f"{field.name}: {getattr(self, field.name)} before, {getattr(after, field.name)} after"
            for field in fields(self)
            if getattr(self, field.name) != getattr(after, field.name)
        ]


def render_containers() -> tuple[str, ...]:
    """Every container a render job of this portal started (facts, probe, frames), running or not."""
    return tuple(sorted(DockerRuntime().containers_for(PURPOSE_LABEL.removeprefix(f"{LABEL_PREFIX}."))))


def traces(render_dir: Path, docker: bool = False) -> Traces:
    """Everything a render action can leave; ``docker``: look at the engine's containers too (tests marked
    ``docker`` only; the others make no container: no job of theirs reaches a slice)."""
    held = Slice.objects.filter(released_at__isnull=True).order_by("pk")
    return Traces(
        files=tuple(sorted(str(path.relative_to(render_dir)) for path in render_dir.rglob("*"))),
        jobs=tuple(RenderJob.objects.order_by("pk").values_list("pk", "state")),
        uploads=tuple(RenderUpload.objects.order_by("pk").values_list("name", flat=True)),
        storage=tuple(StorageUse.objects.order_by("kind", "key").values_list("kind", "key", "bytes")),
        held_slices=tuple((taken.pk, str(taken.holder)) for taken in held),
        containers=render_containers() if docker else None,
    )


def nothing(docker: bool = False) -> Traces:
    """A render folder, a job table, a fleet and an engine with nothing of render jobs in them."""
    return Traces(files=(), jobs=(), uploads=(), storage=(), held_slices=(), containers=() if docker else None)


def assert_left_as_found(before: Traces, render_dir: Path) -> None:
    """Nothing new on disk, no job made or moved, no slice taken, no container left (where looked)."""
    after = traces(render_dir, docker=before.containers is not None)
    differences = before.differences(after)
    assert not differences, "left behind:\n" + "\n".join(differences)


def assert_nothing_left(render_dir: Path, docker: bool = False) -> None:
    """From an empty start: the render folder is empty again, and no job, held slice or container exists."""
    assert_left_as_found(nothing(docker), render_dir)
