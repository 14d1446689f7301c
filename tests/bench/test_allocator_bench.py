"""The allocator benchmark's own arithmetic: the optimum it judges packing by, and how a cell is scored."""

from __future__ import annotations

import argparse

from bench import allocator as bench
from sessions.gpus import placement


def test_the_exhaustive_optimum_places_the_issues_smallest_case_whole() -> None:
    sequence = [bench.H200.profile(name) for name in ("2g.35gb", "3g.71gb", "2g.35gb")]
    assert bench.optimum(bench.H200, 1, sequence) == 3
    assert bench.served(bench.H200, 1, sequence, placement.first_fit) == 3


def test_the_optimum_stops_where_no_placement_holds_the_next_request() -> None:
    sequence = [bench.H200.profile(name) for name in ("4g.71gb", "4g.71gb", "1g.18gb")]
    assert bench.optimum(bench.H200, 1, sequence) == 1  # two 4g never fit one H200, whatever comes after
    assert bench.optimum(bench.H200, 2, sequence) == 3


def test_a_packing_cell_scores_each_rule_against_the_optimum_of_the_same_sequences() -> None:
    args = argparse.Namespace(seed=3, sequences=6, length=8)
    cell = bench.packing_cell(args, bench.H200, 1, bench.two_three_heavy)
    served = cell["served"]
    assert all(
        served[name] <= served["optimum"] for name in ("learned", "fresh", "misled", "told", "prior", "first_fit")
    )
    assert cell["first_fit"] == round(served["first_fit"] / served["optimum"], 4)
    assert served["fresh"] == served["first_fit"]  # sequences of 8 never reach a trusted history: first-fit
    assert cell["goal"] == 0.97
    assert bench.packing_cell(args, bench.H200, 1, bench.two_three_heavy) == cell  # the seed fixes the sequences


def test_the_headline_is_the_worst_margin_over_packing_and_churn() -> None:
    cell = bench.Cell(learned=0.95, fresh=0.94, misled=0.95, told=0.96, prior=0.9, first_fit=0.94, goal=0.97, served={})
    cells = {"mix": {"1xH200": cell}}
    assert bench.worst_against_goal(cells, {}) == round(0.95 / 0.97, 4)  # below the share the goal asks
    misled = {"mix": {"1xH200": bench.Cell(**{**cell, "misled": 0.893})}}
    assert bench.worst_against_goal(misled, {}) == round(0.893 / 0.94, 4)  # after another mix, below first-fit
    churned = {"mix": {"learned": 0.10, "first_fit": 0.08}}
    assert bench.worst_against_goal(cells, churned) == 0.8  # refusing more than first-fit under churn
