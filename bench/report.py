"""Writing a benchmark's result file and RESULT line, as BENCH.md describes."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


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

    def write(self) -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        data.pop("goal_ratio")
        data.pop("goal_value")
        data.update(ratio=self.ratio, met=self.met, when=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        path = RESULTS / f"{self.name}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(
            f"RESULT {self.name} {self.metric}={self.value} baseline={self.baseline} "
            f"ratio={self.ratio} met={str(self.met).lower()}"
        )
        return path


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
