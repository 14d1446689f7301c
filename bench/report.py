"""Writing a benchmark's result file and RESULT line, as BENCH.md describes."""

from __future__ import annotations

import json
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HISTORY = "history.jsonl"  # in the results folder: one line per run, kept in the repository; the table is made from it
TABLE = "README.md"  # in the results folder: the table of each metric's newest run
TABLE_START, TABLE_END = "<!-- table: made by `python -m bench table` from history.jsonl -->", "<!-- end of table -->"


@dataclass
class Result:
    name: str
    metric: str
    value: float
    baseline_name: str
    baseline: float
    better: str
    goal: str
    goal_ratio: float
    unit: str
    details: dict[str, Any] = field(default_factory=dict)
    goal_value: float | None = None  # an absolute goal the issue names, judged besides the ratio

    @property
    def ratio(self) -> float:
        return round(self.value / self.baseline, 3) if self.baseline else float("inf")

    @property
    def met(self) -> bool:
        if self.better == "lower":
            within = self.goal_value is None or self.value <= self.goal_value
            return within and self.ratio <= self.goal_ratio
        within = self.goal_value is None or self.value >= self.goal_value
        return within and self.ratio >= self.goal_ratio

    def write(self, results: Path = RESULTS) -> Path:
        results.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        data.pop("goal_ratio")
        data.pop("goal_value")
        data.update(ratio=self.ratio, met=self.met, when=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        path = results / f"{self.name}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")
        record(
            results,
            name=self.name,
            metric=self.metric,
            value=self.value,
            unit=self.unit,
            baseline=self.baseline,
            baseline_name=self.baseline_name,
            ratio=self.ratio,
            goal=self.goal,
            met=self.met,
        )
        print(
            f"RESULT {self.name} {self.metric}={self.value} baseline={self.baseline} "
            f"ratio={self.ratio} met={str(self.met).lower()}"
        )
        return path


def record(results: Path = RESULTS, **run: Any) -> None:
    """Append one run to the history, with when and at which commit it ran."""
    line = {"when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": _commit(), **run}
    with (results / HISTORY).open("a") as history:
        history.write(json.dumps(line, ensure_ascii=False) + "\n")


def _commit() -> str:
    """The commit measured; "+changes" when tracked files differ from it (a run to keep is made on a commit)."""
    try:
        found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = ["git", "status", "--porcelain", "--untracked-files=no"]
        changed = subprocess.run(status, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return found.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def latest_runs(results: Path = RESULTS) -> list[dict[str, Any]]:
    """The newest run of each benchmark and metric, in the order each first appears in the history."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for text in (results / HISTORY).read_text().splitlines():
        if text.strip():
            run = json.loads(text)
            latest[(run["name"], run["metric"])] = run
    return list(latest.values())


def table(results: Path = RESULTS) -> str:
    """The table of the latest figures, as Markdown."""
    rows = [
        "| benchmark | metric | value | baseline | ratio | goal | met | when | commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in latest_runs(results):
        value = f"{run['value']} {run.get('unit', '')}".strip()
        baseline = "—" if run["baseline"] is None else run["baseline"]
        if run.get("baseline_name"):
            baseline = f"{baseline} ({run['baseline_name']})"
        met = "yes" if run["met"] else "no"
        if run.get("note"):
            met = f"{met}; {run['note']}"
        ratio = "—" if run["ratio"] is None else run["ratio"]
        cells = [run["name"], run["metric"], value, baseline, ratio, run["goal"], met, run["when"][:10]]
        rows.append("| " + " | ".join(str(cell).replace("|", "/") for cell in [*cells, run["commit"]]) + " |")
    return "\n".join(rows)


def write_table(results: Path = RESULTS) -> Path:
    """Put the table into the results folder's README.md, between its markers."""
    page = results / TABLE
    head, _, rest = page.read_text().partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    page.write_text(f"{head}{TABLE_START}\n{table(results)}\n{TABLE_END}{tail}")
    return page


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (share in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, round(share / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def summary_ms(latencies_s: list[float]) -> dict[str, float]:
    ms = [value * 1000 for value in latencies_s]
    return {
        "requests": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }
