"""Benchmark figures as data: each run appends a line to the history, the table shows each metric's newest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report
from bench.report import Result


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results folder of this test's own, with the table's page as the repository has it."""
    (tmp_path / report.TABLE).write_text((report.RESULTS / report.TABLE).read_text())
    return tmp_path


def run(value: float, baseline: float) -> Result:
    return Result("toy", "p99", value, "bare", baseline, "lower", "ratio <= 1.0", 1.0, "ms")


def test_each_run_is_a_line_and_the_table_shows_each_metric_s_newest_run(results: Path) -> None:
    run(12.0, 10.0).write(results)
    run(8.0, 10.0).write(results)
    lines = [json.loads(line) for line in (results / "history.jsonl").read_text().splitlines()]
    assert [(line["value"], line["ratio"], line["met"]) for line in lines] == [(12.0, 1.2, False), (8.0, 0.8, True)]
    assert all(line["when"].endswith("Z") and "commit" in line for line in lines)
    report.write_table(results)
    page = (results / "README.md").read_text()
    [row] = [row for row in page.splitlines() if row.startswith("| toy |")]
    assert "| 8.0 ms | 10.0 (bare) | 0.8 | ratio <= 1.0 | yes |" in row
    assert page.index(report.TABLE_START) < page.index("| toy |") < page.index(report.TABLE_END)
    report.write_table(results)  # made again: the same page
    assert (results / "README.md").read_text() == page


def test_the_repository_s_table_is_the_one_its_history_makes() -> None:
    """Nobody edits the table by hand: it is what `python -m bench table` makes from the history."""
    page = (report.RESULTS / report.TABLE).read_text()
    made = page.split(report.TABLE_START, 1)[1].split(report.TABLE_END, 1)[0].strip()
    assert made == report.table()
