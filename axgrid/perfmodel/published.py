"""Published data points we hold, and the model's prediction for each (``python -m axgrid.perfmodel check-published``).

Two kinds of point:

* throughput points (AxoNN's SC24 and 4D papers, the Frontier study): sustained TFLOP/s per GPU, bf16, sequence
  2048, vocabulary 51200. Their configurations are not held, so the global batch is assumed to be one sequence per
  GPU, activation recompute and all overlaps are on (the 4D runtime's defaults), and the prediction is the
  best-ranked configuration of the published layout (4D grids for AxoNN's runs, TP×PP×DP for the Frontier study's
  Megatron-DeepSpeed runs); "in top 5" cannot be answered. Megatron-DeepSpeed pipelines with DeepSpeed's
  ``PipelineEngine`` (its ``TrainSchedule``: 1F1B over whole stages, no interleaved model chunks), so the Frontier
  study's points take the best row without interleaving (``Published.interleaved``).
* configuration points (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  Table 5: Megatron-LM on Selene's DGX A100 80 GB nodes, fp16, sequence 2048, vocabulary 51200): a published
  time per iteration at a published TP, PP, interleaving, micro-batch size, global batch and recompute (full, or
  selective + sequence parallel), priced at exactly that configuration. The model's memory verdict is reported
  but does not stop the pricing (the run was made, so it fitted). Their element-wise kernels are Megatron-LM
  2022's: dropout and an unfused attention softmax (``Options.dropout``, ``fused_attention``); the throughput
  points keep the defaults (no dropout, flash-style attention), their runs' settings not being held.

Gradient reductions are priced in the points' compute dtype (``Options.grad_reduce``): Megatron-LM's fp16 runs
all-reduce fp16 gradients, and AxoNN's intra-layer reduce-scatters act on the GEMMs' low-precision outputs (an
assumption for its data-parallel all-reduce: its runs' settings are not held). axgrid's own runtime reduces them in fp32 by default
(``RuntimeConfig.grad_reduce_dtype``), and ``rank`` prices that.

The ratio is predicted / published throughput = published / predicted time (> 1: the model is optimistic), and
``ln(ratio)`` is the residual the error band uses (``perfmodel.band``).
"""
from __future__ import annotations

from dataclasses import dataclass

from axgrid.spec import TransformerShape

from .band import Residual, residuals_path, write_residuals
from .machines import load_machine
from .pipeline import price_named
from .rank import rank
from .row import Row
from .problem import Options, Problem, get_model

#: the goal: |predicted / published − 1| ≤ TOLERANCE for every point
TOLERANCE = 0.15
#: memory multiplier that keeps a published configuration's time priced when the memory model rejects it
_NO_MEMORY_LIMIT = 1e3


@dataclass(frozen=True)
class Published:
    """One published figure: sustained TFLOP/s per GPU (``tflops_per_gpu``), or seconds per iteration
    (``seconds``) at a held configuration (``config`` = (TP, PP, DP) with ``mbs``, ``vpp``, ``sp``, ``recompute``
    and ``global_batch``), and where it comes from."""

    name: str
    machine: str
    model: str | TransformerShape
    gpus: int
    tflops_per_gpu: float | None
    layout: str                       # "4D" (AxoNN) or "TPxPPxDP" (Megatron-style)
    source: str
    config: tuple[int, ...] | None = None   # 4D grid, or (TP, PP, DP), when public and held
    seconds: float | None = None
    global_batch: int | None = None
    dtype: str = "bf16"
    mbs: int = 1
    vpp: int = 1
    sp: bool = False
    recompute: str | None = None
    dropout: bool = False             # the run's element-wise kernels (``Options.dropout`` / ``fused_attention``)
    fused_attention: bool = True
    interleaved: bool = True          # the run's pipeline could interleave model chunks (VPP > 1)

    @property
    def problem(self) -> Problem:
        """The point's problem, with the element-wise kernels its runtime ran."""
        return Problem(self.spec, self.batch, self.gpus, self.dtype,
                       Options(dropout=self.dropout, fused_attention=self.fused_attention, grad_reduce=self.dtype))

    @property
    def batch(self) -> int:
        return self.global_batch or self.gpus

    @property
    def spec(self) -> TransformerShape:
        return self.model if isinstance(self.model, TransformerShape) else get_model(self.model)


def _korthikanti(size: str, layers: int, hidden: int, heads: int, tp: int, pp: int, vpp: int, gpus: int,
                 batch: int, mbs: int, full_s: float, selective_s: float) -> tuple[Published, Published]:
    spec = TransformerShape(f"korthikanti-{size.lower()}", layers, hidden, heads, seq=2048, vocab=51200)
    src = (f"Korthikanti et al. 2022 (arXiv 2205.05198) Table 5, {size}: TP {tp}, PP {pp}"
           + (f", interleaved {vpp}" if vpp > 1 else "") + f", {gpus} A100 80 GB, batch {batch}, micro-batch {mbs}")
    common = dict(machine="dgx-a100", model=spec, gpus=gpus, tflops_per_gpu=None, layout="TPxPPxDP",
                  config=(tp, pp, gpus // (tp * pp)), global_batch=batch, dtype="fp16", mbs=mbs, vpp=vpp,
                  dropout=True, fused_attention=False)    # Megatron-LM 2022: dropout 0.1, unfused softmax
    return (Published(f"Korthikanti {size} full", source=src + ": full recompute", seconds=full_s,
                      recompute="full", **common),
            Published(f"Korthikanti {size} sel+SP", source=src + ": selective recompute + sequence parallel",
                      seconds=selective_s, recompute="selective", sp=True, **common))


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
              "Frontier study (arXiv 2312.12705): 22B at 38.38% of peak; shape and 1,024 GCDs assumed", interleaved=False),
    Published("Frontier study 175B", "frontier", "gpt-175b", 1024, 0.3614 * 191.5, "TPxPPxDP",
              "Frontier study: 175B at 36.14% of peak; 1,024 GCDs (its weak-scaling point)", interleaved=False),
    Published("Frontier study 1T", "frontier", "gpt-1t", 3072, 0.3196 * 191.5, "TPxPPxDP",
              "Frontier study: 1T at 31.96% of peak; 3,072 GCDs (its weak-scaling point)", interleaved=False),
    *_korthikanti("22B", 48, 6144, 64, 8, 1, 1, 8, 4, 4, 1.42, 1.10),
    *_korthikanti("175B", 96, 12288, 96, 8, 8, 3, 64, 64, 1, 18.13, 13.75),
    *_korthikanti("530B", 105, 20480, 128, 8, 35, 3, 280, 280, 1, 49.05, 37.83),
    *_korthikanti("1T", 128, 25600, 160, 8, 64, 1, 512, 512, 1, 94.42, 71.49),
)


@dataclass(frozen=True)
class Check:
    """A published point and the model's prediction for it; ``memory_note``: the memory model's verdict on a
    published configuration it would have rejected ("" when it fits)."""

    point: Published
    predicted: Row
    top5: bool | None       # None: the published configuration is not held (or priced as published)
    memory_note: str = ""

    @property
    def ratio(self) -> float:
        if self.point.seconds is not None:
            return self.point.seconds / self.predicted.time_s
        return self.predicted.tflops_per_gpu / self.point.tflops_per_gpu

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE


def _same(row: Row, point: Published) -> bool:
    if point.layout == "4D":
        return row.layout == "4D" and row.grid == point.config
    return row.layout != "4D" and (row.grid[1], row.pp, row.grid[3]) == point.config


def _check_configuration(point: Published) -> Check:
    machine = load_machine(point.machine)
    prob = point.problem
    tp, pp, dp = point.config
    row = price_named(prob, machine.scaled(memory=_NO_MEMORY_LIMIT), tp, pp, dp, point.vpp, point.sp, point.mbs,
                      point.recompute)
    limit = prob.options.memory_usable * machine.memory_bytes
    note = (f"memory model: {row.memory_bytes / 2**30:.1f} GiB > {limit / 2**30:.1f} GiB usable"
            if row.memory_bytes > limit else "")
    return Check(point, row, None, note)


def check(point: Published) -> Check:
    """Price the point: at its published configuration when it has one with a time, else rank its problem on
    its shipped machine file and take the best row of the published layout."""
    if point.seconds is not None:
        return _check_configuration(point)
    machine = load_machine(point.machine)
    prob = point.problem
    rk = rank(prob, machine, tp_pp_dp=point.layout != "4D", require_feasible=point.layout == "4D")
    rows = rk.feasible if point.layout == "4D" else [r for r in rk.megatron if r.feasible
                                                     and (point.interleaved or r.vpp == 1)]
    if point.config is None:
        return Check(point, rows[0], None)
    held = [r for r in rows if _same(r, point)]
    pred = held[0] if held else rows[0]
    return Check(point, pred, any(_same(r, point) for r in rows[:5]))


def check_all() -> list[Check]:
    return [check(p) for p in POINTS]


WRITE_COMMAND = "python -m axgrid.perfmodel check-published --write-residuals"


def residuals_of(checks: list[Check]) -> dict[str, list[Residual]]:
    """Machine name → the residuals of its points (``perfmodel.band``): measured = the published time
    (for a throughput point: the predicted time × predicted / published TFLOP/s, the same FLOP count)."""
    out: dict[str, list[Residual]] = {}
    for c in checks:
        r = c.predicted
        out.setdefault(c.point.machine, []).append(Residual(
            c.point.name, r.layout, c.point.gpus, r.grid_str, r.time_s, r.time_s * c.ratio))
    return out


def write_all_residuals(checks: list[Check]) -> list:
    """Store every machine's residuals next to its shipped TOML; returns the files written."""
    return [write_residuals(residuals_path(load_machine(m)), m, pts, WRITE_COMMAND)
            for m, pts in residuals_of(checks).items()]


__all__ = ["TOLERANCE", "Published", "POINTS", "Check", "check", "check_all", "residuals_of", "write_all_residuals"]
