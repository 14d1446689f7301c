"""The prices a new portal starts with, and where each figure comes from.

Whole GPU, on-demand: the seeds' price table (../shared/seeds/gpu-cloud-platform-guide.zh.txt, the
table of vendors and prices: 阿里云 NVIDIA A100, 8.5 元/小时) gives 8.5 CNY an hour for an A100, taken
here as the A100-SXM4-80GB. Other models are scaled from it, half by dense FP16/BF16 tensor throughput
and half by memory, each relative to that A100 (312 TFLOPS, 80 GiB), the figures from NVIDIA's data
sheets (below) and the memory from sessions/gpus/data/gpu_models.json.

A MIG profile costs the whole GPU's price times its share of the GPU's compute slices (3g.40gb: 3/7);
the +me variants cost the same as their plain profile. A time-sliced GPU is priced as the whole GPU,
and each of its N shares pays 1/N (see billing/money.py). Spot is 60 % off on-demand, the cautious end
of the seeds' "60-90 % cheaper" (same guide, 5.1 竞价实例应用: 较按需实例降低60-90%成本).
Hourly prices are rounded half up to four decimals.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Model

from billing.money import per_minute
from sessions.gpus import catalog

SOURCE = "seed: A100 8.5 CNY/h (seeds' price table), scaled per billing/seeds.py"
EFFECTIVE_FROM = datetime(2000, 1, 1, tzinfo=UTC)  # before any holding: every holding has a price
A100_PER_HOUR = Decimal("8.5")
A100_TFLOPS = Decimal(312)
A100_MEMORY_GIB = Decimal(80)
SPOT_FACTOR = Decimal("0.40")  # 60 % off
# Dense FP16/BF16 tensor TFLOPS (without sparsity), NVIDIA data sheets.
TFLOPS = {
    "A100-SXM4-40GB": Decimal(312),
    "A100-SXM4-80GB": Decimal(312),
    "H100-SXM5-80GB": Decimal("989.4"),
    "H200-SXM5-141GB": Decimal("989.4"),
    "A30-24GB": Decimal(165),
    "L4-24GB": Decimal("121"),
    "L40S-48GB": Decimal("362.05"),
    "T4-16GB": Decimal(65),
}
FOUR_PLACES = Decimal("0.0001")


def whole_gpu_per_hour(model: catalog.GpuModel) -> Decimal:
    compute = TFLOPS[model.name] / A100_TFLOPS
    memory = Decimal(str(model.memory_gib)) / A100_MEMORY_GIB
    return A100_PER_HOUR * (compute + memory) / 2


def rounded(per_hour: Decimal) -> Decimal:
    return per_hour.quantize(FOUR_PLACES, rounding=ROUND_HALF_UP)


def seed_rows() -> list[dict[str, object]]:
    """Every seeded price: each catalog model whole, time-sliced and per MIG profile, on-demand and spot."""
    rows = []
    for model in catalog.models().values():
        whole = whole_gpu_per_hour(model)
        kinds = [("whole", "", whole), ("shared", "", whole)]
        kinds += [("mig", p.name, whole * p.compute_slices / model.compute_slices) for p in model.profiles]
        for kind, profile, per_hour in kinds:
            for market, factor in (("on_demand", Decimal(1)), ("spot", SPOT_FACTOR)):
                rows.append(
                    {
                        "model_name": model.name,
                        "kind": kind,
                        "profile": profile,
                        "market": market,
                        "per_hour": rounded(per_hour * factor),
                        "effective_from": EFFECTIVE_FROM,
                        "source": SOURCE,
                    }
                )
    return rows


def ensure(price_model: type[Model]) -> int:
    """Write every seeded price not there yet (the data migration passes its historical model); returns how many."""
    added = 0
    for row in seed_rows():
        values = {key: row[key] for key in ("model_name", "kind", "profile", "market", "effective_from")}
        per_hour = row["per_hour"]
        assert isinstance(per_hour, Decimal)
        defaults = {"per_hour": per_hour, "per_minute": per_minute(per_hour), "source": row["source"]}
        _, created = price_model._default_manager.get_or_create(**values, defaults=defaults)
        added += created
    return added
