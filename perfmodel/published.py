"""Published data points we hold, and the model's prediction for each (``python -m axgrid.perfmodel check-published``).

Assumptions for every point (the publications' batch sizes are not held here): bf16, sequence 2048, vocabulary
51200, global batch = one sequence per GPU (batch = GPUs), activation recompute and all overlaps on (the 4D
runtime's defaults), the machine files as shipped. Where the published configuration is not held (every point so
far: the SC24 and 4D papers' grids and the Frontier study's TP/PP/DP are not in our references), the prediction is
the best-ranked configuration of the published layout (4D grids for AxoNN's runs, TP×PP×DP for the Megatron-
DeepSpeed runs of the Frontier study), and "in top 5" cannot be answered.
"""
from __future__ import annotations

from dataclasses import dataclass

from .machines import load_machine
from .rank import rank
from .row import Row
from .spec import Problem, get_model

#: the goal: |predicted / published − 1| ≤ TOLERANCE for every point
TOLERANCE = 0.15


@dataclass(frozen=True)
class Published:
    """One published sustained-throughput figure (TFLOP/s per GPU, bf16) and where it comes from."""

    name: str
    machine: str
    model: str
    gpus: int
    tflops_per_gpu: float
    layout: str                       # "4D" (AxoNN) or "TPxPPxDP" (Megatron-style)
    source: str
    config: tuple[int, ...] | None = None   # 4D grid, or (TP, PP, DP), when public and held

    @property
    def batch(self) -> int:
        return self.gpus


POINTS: tuple[Published, ...] = (
    Published("SC24 Perlmutter 40B", "perlmutter", "gpt-40b", 4096, 620.1e3 / 4096, "4D",
              "SC24 paper headline: 620.1 PFLOP/s bf16 sustained on 4,096 A100 = 151.4 TFLOP/s/GPU"),
    Published("SC24 Frontier 320B", "frontier", "gpt-320b", 32768, 1.381e6 / 32768, "4D",
              "SC24 paper headline: 1.381 EFLOP/s on 32,768 MI250X GCDs = 42.1 TFLOP/s/GCD"),
    Published("SC24 Alps 60B", "alps", "gpt-60b", 6144, 1.423e6 / 6144, "4D",
              "SC24 paper headline: 1.423 EFLOP/s on 6,144 GH200 = 231.6 TFLOP/s/GPU"),
    Published("4D paper Perlmutter 80B", "perlmutter", "gpt-80b", 1024, 0.57 * 312, "4D",
              "arXiv 2305.13525: 80B GPT on 1,024 A100 at 57% of peak (182 PFLOP/s)"),
    Published("Frontier study 22B", "frontier", "gpt-22b", 1024, 0.3838 * 191.5, "TPxPPxDP",
              "Frontier study (arXiv 2312.12705): 22B at 38.38% of peak; shape and 1,024 GCDs assumed"),
    Published("Frontier study 175B", "frontier", "gpt-175b", 1024, 0.3614 * 191.5, "TPxPPxDP",
              "Frontier study: 175B at 36.14% of peak; 1,024 GCDs (its weak-scaling point)"),
    Published("Frontier study 1T", "frontier", "gpt-1t", 3072, 0.3196 * 191.5, "TPxPPxDP",
              "Frontier study: 1T at 31.96% of peak; 3,072 GCDs (its weak-scaling point)"),
)


@dataclass(frozen=True)
class Check:
    """A published point and the model's prediction for it."""

    point: Published
    predicted: Row
    top5: bool | None       # None: the published configuration is not held

    @property
    def ratio(self) -> float:
        return self.predicted.tflops_per_gpu / self.point.tflops_per_gpu

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE


def _same(row: Row, point: Published) -> bool:
    if point.layout == "4D":
        return row.layout == "4D" and row.grid == point.config
    return row.layout != "4D" and (row.grid[1], row.pp, row.grid[3]) == point.config


def check(point: Published) -> Check:
    """Rank the point's problem on its shipped machine file and compare."""
    machine = load_machine(point.machine)
    prob = Problem(get_model(point.model), point.batch, point.gpus, "bf16")
    rk = rank(prob, machine, tp_pp_dp=point.layout != "4D", require_feasible=point.layout == "4D")
    rows = rk.feasible if point.layout == "4D" else [r for r in rk.megatron if r.feasible]
    if point.config is None:
        return Check(point, rows[0], None)
    held = [r for r in rows if _same(r, point)]
    pred = held[0] if held else rows[0]
    return Check(point, pred, any(_same(r, point) for r in rows[:5]))


def check_all() -> list[Check]:
    return [check(p) for p in POINTS]


__all__ = ["TOLERANCE", "Published", "POINTS", "Check", "check", "check_all"]
