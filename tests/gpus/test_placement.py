"""The placement rule, on its own: legality, capacity counts, and where things go."""

from __future__ import annotations

import pytest

from sessions.gpus import catalog, placement
from sessions.gpus.placement import Layout

H200 = catalog.model("H200-SXM5-141GB")
A30 = catalog.model("A30-24GB")


def test_the_catalog_knows_every_model_and_its_geometry() -> None:
    assert (H200.memory_slices, H200.compute_slices) == (8, 7)
    assert (A30.memory_slices, A30.compute_slices) == (4, 4)
    assert H200.profile("7g.141gb").placements == (0,)
    assert H200.profile("1g.18gb").placements == (0, 1, 2, 3, 4, 5, 6)
    assert H200.profile("3g.71gb").smi_profile_id == 9


def test_an_unknown_profile_names_the_model_and_its_profiles() -> None:
    with pytest.raises(catalog.UnknownProfile, match=r"A30-24GB has no MIG profile '3g\.71gb'; its profiles: 1g\.6gb"):
        A30.profile("3g.71gb")


def test_nvml_product_names_map_to_catalog_models() -> None:
    assert catalog.model_for_product_name("NVIDIA H200", 143771) == H200
    assert catalog.model_for_product_name("NVIDIA A100-SXM4-40GB", 40960) == catalog.model("A100-SXM4-40GB")
    assert catalog.model_for_product_name("NVIDIA GeForce RTX 4090", 24564) is None


def test_a_one_slice_profile_on_an_empty_gpu_keeps_the_big_positions() -> None:
    found = placement.best_start(H200, Layout(), H200.profile("1g.18gb"))
    assert found is not None
    start = found[0]
    assert start not in (0, 4)  # 0 blocks the 4g, 4 blocks the second 3g
    layout = Layout().with_instance(H200.profile("1g.18gb"), start)
    assert placement.fit_count(H200, layout, H200.profile("4g.71gb")) == 1


def test_fit_counts_each_profile_alone() -> None:
    layout = placement.layout_of(H200, [("3g.71gb", 4)])
    capacity = placement.capacity(H200, layout)
    assert capacity["4g.71gb"] == 1
    assert capacity["3g.71gb"] == 1
    assert capacity["2g.35gb"] == 2
    assert capacity["1g.18gb"] == 4
    assert capacity["7g.141gb"] == 0


def test_our_rule_picks_the_fullest_gpu_and_first_fit_the_first() -> None:
    empty = Layout()
    busy = placement.layout_of(H200, [("3g.71gb", 4)])
    candidates = [("empty", empty), ("busy", busy)]
    profile = H200.profile("1g.18gb")
    assert placement.choose(H200, candidates, profile) == ("busy", 3)
    assert placement.first_fit(H200, candidates, profile) == ("empty", 0)


def test_nothing_is_chosen_when_nothing_fits() -> None:
    full = placement.layout_of(H200, [("7g.141gb", 0)])
    assert placement.choose(H200, [(1, full)], H200.profile("1g.18gb")) is None
    assert placement.first_fit(H200, [(1, full)], H200.profile("1g.18gb")) is None


def test_releasing_undoes_placing_exactly() -> None:
    profile = H200.profile("2g.35gb")
    before = placement.layout_of(H200, [("1g.18gb", 6)])
    assert before.with_instance(profile, 2).without_instance(profile, 2) == before


def test_a_layouts_key_names_it_exactly() -> None:
    layout = placement.layout_of(H200, [("3g.71gb", 4), ("1g.18gb", 3), ("1g.18gb", 2)])
    assert layout.key == "252:5:1g.18gb=2,3g.71gb=1"
    assert Layout.from_key(layout.key) == layout
    assert Layout.from_key(Layout().key) == Layout()
