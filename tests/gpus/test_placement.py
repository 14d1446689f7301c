"""The placement rule, on its own: legality, capacity counts, and where things go."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

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


def place_in_turn(
    gpu_model: catalog.GpuModel, names: list[str], demand: placement.Demand | None = None
) -> list[int | None]:
    """Place each profile on one GPU with our rule; the start each got, None where refused."""
    layout, starts = Layout(), []
    for name in names:
        profile = gpu_model.profile(name)
        choice = placement.choose(gpu_model, [(0, layout)], profile, demand)
        starts.append(None if choice is None else choice[1])
        if choice is not None:
            layout = layout.with_instance(profile, choice[1])
    return starts


def test_one_h200_that_has_seen_2g_and_3g_requests_takes_a_2g_a_3g_and_a_2g() -> None:
    # Issue 12: on the prior alone the first 2g went to slice 4, the 3g to 0, and the second 2g was refused.
    seen = placement.learned(H200, {"2g.35gb": 40, "3g.71gb": 40, "1g.18gb": 20})
    starts = place_in_turn(H200, ["2g.35gb", "3g.71gb", "2g.35gb"], seen)
    assert set(starts) == {0, 2, 4}


def test_from_its_first_request_the_portal_s_rule_is_never_worse_than_first_fit() -> None:
    """Issue 31: with an empty history the value rule under the prior put the first 2g at slice 4 and the 3g at
    0, and refused the second 2g, where first-fit serves all three. Until it has seen enough requests to trust
    their demand, the portal's rule places as first-fit does; from then on, by the learned demand."""
    sequence = [H200.profile(name) for name in ("2g.35gb", "3g.71gb", "2g.35gb")]

    def serve(requested: dict[str, int]) -> list[int | None]:
        layout, starts = placement.Layout(), []
        for profile in sequence:
            choice = placement.by_history(H200, [(0, layout)], profile, requested)
            starts.append(None if choice is None else choice[1])
            if choice is not None:
                layout = layout.with_instance(profile, choice[1])
        return starts

    assert serve({}) == [0, 4, 2]  # first-fit's
    assert placement.choose(H200, [(0, placement.Layout())], sequence[0]) == (0, 4)  # the prior's bet, not taken
    thin = {"2g.35gb": 10, "3g.71gb": 10}
    assert not placement.trusted(thin) and serve(thin) == [0, 4, 2]
    mostly_1g = {"1g.18gb": placement.TRUSTED_REQUESTS, "4g.71gb": 10}
    assert placement.trusted(mostly_1g)
    learned = placement.learned(H200, mostly_1g)
    bet = placement.choose(H200, [(0, placement.Layout())], sequence[0], learned)
    assert bet is not None and serve(mostly_1g)[0] == bet[1]


def test_with_nothing_seen_the_demand_is_the_prior() -> None:
    assert placement.learned(H200, {}) == placement.prior(H200)
    assert placement.learned(H200, {"2g.35gb": 0}) == placement.prior(H200)
    assert placement.prior(H200).share("1g.18gb") > placement.prior(H200).share("3g.71gb")


def test_the_demand_moves_toward_what_is_requested() -> None:
    before = placement.prior(H200).share("3g.71gb")
    few = placement.learned(H200, {"3g.71gb": 10}).share("3g.71gb")
    many = placement.learned(H200, {"3g.71gb": 1000}).share("3g.71gb")
    assert before < few < many
    assert many > 0.95
    assert placement.learned(H200, {"3g.71gb": 1000}).share("1g.18gb") < placement.prior(H200).share("1g.18gb")


def test_profiles_the_model_does_not_have_are_ignored() -> None:
    asked = {"2g.35gb": 12, "3g.20gb": 500, "whole": 40}  # an A100 profile and a word that is no profile
    assert placement.learned(H200, asked) == placement.learned(H200, {"2g.35gb": 12})
    assert placement.learned(H200, {"3g.20gb": 500}) == placement.prior(H200)


def test_a_demand_is_weights_in_steps_and_refuses_an_empty_mix() -> None:
    demand = placement.Demand.of({"1g.18gb": 3.0, "2g.35gb": 1.0, "3g.71gb": 0.0})
    assert demand.weights == (("1g.18gb", 150), ("2g.35gb", 50))
    assert demand.share("1g.18gb") == 0.75
    assert demand.share("7g.141gb") == 0.0
    with pytest.raises(ValueError, match="positive weight"):
        placement.Demand.of({"1g.18gb": 0.0})


def test_the_rule_refuses_a_demand_for_another_model_in_words() -> None:
    a100_demand = placement.learned(catalog.model("A100-SXM4-40GB"), {"3g.20gb": 5})
    with pytest.raises(ValueError, match="asks for no profile of H200-SXM5-141GB"):
        placement.choose(H200, [(0, Layout())], H200.profile("1g.18gb"), a100_demand)


def test_what_the_demand_favours_decides_where_a_slice_goes() -> None:
    # Small slices expected: the 2g keeps slices 0-3 whole for a 4g. 2g and 3g expected: it keeps slices 4-7 for a 3g.
    two = H200.profile("2g.35gb")
    on_the_prior = placement.best_start(H200, Layout(), two)
    assert on_the_prior is not None and on_the_prior[0] == 4
    seen = placement.learned(H200, {"2g.35gb": 50, "3g.71gb": 50})
    learned = placement.best_start(H200, Layout(), two, seen)
    assert learned is not None and learned[0] in (0, 2)


def test_a_layout_no_legal_placement_reaches_still_gets_a_choice() -> None:
    # Bookkeeping a driver disagrees with: a 2g at slice 6, where the catalog never puts one.
    odd = Layout(memory_mask=0b11000000, compute_used=2, counts=(("2g.35gb", 1),))
    assert placement.why_not(H200, odd, H200.profile("2g.35gb"), 6) is not None
    assert placement.choose(H200, [(0, odd)], H200.profile("3g.71gb")) == (0, 0)
    assert placement.value(H200, odd) > 0


def test_our_rule_breaks_a_tie_between_equal_gpus_by_their_order() -> None:
    busy = placement.layout_of(H200, [("3g.71gb", 4)])
    same = placement.layout_of(H200, [("3g.71gb", 4)])
    assert placement.choose(H200, [("a", busy), ("b", same), ("c", Layout())], H200.profile("1g.18gb")) == ("a", 3)
    assert placement.choose(H200, [("c", Layout()), ("b", same), ("a", busy)], H200.profile("1g.18gb")) == ("b", 3)


def test_a_layout_and_a_demand_pickled_here_are_found_by_another_process() -> None:
    # Both cache their hash; a str hashes differently in another process, so the hash must not travel.
    layout = placement.layout_of(H200, [("3g.71gb", 4), ("1g.18gb", 3)])
    demand = placement.learned(H200, {"2g.35gb": 5})
    sent = pickle.dumps((hash(layout), hash(demand), layout, demand))
    program = (
        "import pickle, sys\n"
        "from sessions.gpus import catalog, placement\n"
        "H200 = catalog.model('H200-SXM5-141GB')\n"
        "_, _, layout, demand = pickle.loads(sys.stdin.buffer.read())\n"
        "here = placement.layout_of(H200, [('3g.71gb', 4), ('1g.18gb', 3)])\n"
        "print({here: 'found'}.get(layout), {placement.learned(H200, {'2g.35gb': 5}): 'found'}.get(demand))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", program], input=sent, capture_output=True, env=env, check=True)
    assert done.stdout.decode().split() == ["found", "found"]


def test_the_recent_requests_keep_the_last_ones_counted() -> None:
    recent = placement.Recent(["1g.18gb"] * 5, keep=6)
    for name in ("3g.71gb", "3g.71gb", "2g.35gb"):
        recent.add(name)
    assert +recent.counts == {"1g.18gb": 3, "3g.71gb": 2, "2g.35gb": 1}
    assert list(recent.names) == ["1g.18gb"] * 3 + ["3g.71gb", "3g.71gb", "2g.35gb"]
