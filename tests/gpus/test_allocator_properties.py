"""Random allocate/release sequences on every MIG model, checked by an independent checker."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from sessions.gpus import catalog
from sessions.gpus.allocator import AllocationRefused, SliceRequest, allocate, release
from sessions.gpus.models import Gpu, Slice
from tests.gpus import checker
from tests.gpus.conftest import FleetMaker

MIG_MODELS = [model for model in catalog.models().values() if model.mig_capable]
operations = st.lists(
    st.tuples(st.sampled_from(["allocate", "allocate", "release"]), st.integers(0, 1_000)), min_size=1, max_size=25
)


def layouts() -> dict[int, object]:
    return {gpu.pk: gpu.layout() for gpu in Gpu.objects.all()}


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda m: m.name)
def test_random_sequences_keep_every_placement_legal(
    model: catalog.GpuModel, make_fleet: FleetMaker, many_slices: User
) -> None:
    @hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(operations)
    def run(ops: list[tuple[str, int]]) -> None:
        Slice.objects.all().delete()
        make_fleet(f"prop: 2x{model.name}:mig")
        held: list[tuple[Slice, dict[int, object]]] = []
        for op, pick in ops:
            if op == "allocate":
                profile = model.profiles[pick % len(model.profiles)]
                before = layouts()
                try:
                    held.append((allocate(many_slices, SliceRequest(kind="mig", profile=profile.name)), before))
                except AllocationRefused as refused:
                    assert refused.code == "no_capacity"
                    assert layouts() == before, "a refused request changed the fleet"
            elif held:
                taken, _ = held.pop(pick % len(held))
                gpu_before = Gpu.objects.get(pk=taken.gpu_id).layout()
                release(taken.pk)
                after = Gpu.objects.get(pk=taken.gpu_id).layout()
                profile = model.profile(taken.profile)
                assert after == gpu_before.without_instance(profile, taken.placement_start or 0)
            assert checker.problems() == []
        for taken, _ in held:
            release(taken.pk)
        assert all(gpu.memory_mask == 0 and gpu.compute_used == 0 for gpu in Gpu.objects.all())

    run()
