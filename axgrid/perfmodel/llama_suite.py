"""The ``llama-public`` validation suite: Llama-family bf16 training throughput on H100 and A100 measured by others
(``data/llama_public.csv``; ``data/README.md`` names every source), each row priced at its published configuration.

A row is one published measurement: the model (a name of ``axgrid.spec.PUBLIC_MODELS``), the GPUs, the layout, the
batch, the sequence, the activation recompute, and the measured throughput (tokens/s/GPU, or TFLOP/s/GPU). Its
``status`` says whether it is priced: a row whose conditions perfmodel does not model (FP8 GEMMs, torch.compile's
fused kernels, context parallelism, a recompute policy whose parameter is not published, a shape not held) is
``excluded`` with its reason, printed by ``validate-public``; nothing is fitted to any row.

Layouts:

* ``fsdp``: FSDP (PyTorch FSDP/FSDP2, ZeRO-3: weights, gradients and optimizer states sharded over ``fsdp`` GPUs,
  the weights all-gathered per block in forward and backward, the gradients reduce-scattered) with ``tp``-way
  tensor parallelism inside it and ``replicas`` copies (HSDP: the sharded gradients all-reduced across copies).
  It is the 4D grid (1, tp, fsdp, replicas): the runtime's z dimension shards the weights and the batch as FSDP
  does (AxoNN's algorithm), its y dimension is a 1D tensor parallelism. Priced with ``model.evaluate`` at that one
  grid, zero 0, one micro-batch per step unless the row says a micro-batch smaller than the local batch.
* ``megatron``: Megatron-style TP × PP × DP (``pipeline.price``), with the distributed optimizer; where the row
  does not give the interleaving or the micro-batch (``mbs`` empty), the best of the configurations perfmodel
  allows (``pipeline.VPP_CHOICES`` × ``pipeline.MICROBATCH_SIZES``) is taken and the row says so.

Recompute: ``none`` and ``full`` are the model's; ``selective-op`` (torchtitan's per-op policy, which saves every
op's output except every second matmul's: half the linear layers' forward GEMMs and their element-wise work run
again, the attention does not) and ``selective-layer`` (every second block fully recomputed) are both priced as
half-way between none and full: t = (t_none + t_full) / 2. For ``selective-layer`` that is what it does; for
``selective-op`` it over-counts the attention's forward by half of it (a few per cent of the step at 8,192 tokens).

Machine: the row's machine file, memory not limiting (the runs were made), with the conditions the source states
and the model can express: ``inter_node_gbps_per_gpu`` (the network per GPU, replacing the file's inter-node
bandwidth; empty: the file's) and ``hbm_tbps`` (the GPU's datasheet HBM bandwidth: the file's ``hbm_bandwidth``
scaled by its ratio to the file GPU's datasheet figure, ``DATASHEET_HBM``) and ``peak_tflops_bf16`` (a GPU
run below its datasheet power, whose sustained clock and so its tensor-core rate are lower: the dense bf16 peak
at that power limit; every compute rate of the file, its GEMM table's included, is scaled by its ratio to the
file's ``peak_flops_bf16``; empty: the file's). torchtitan's Grand Teton H100s run at a 500 W limit (the SXM's
is 700 W): their rows give 886.8 TFLOP/s, NVIDIA's datasheet dense bf16 peaks interpolated linearly in power
between the H100 NVL (835.5 TFLOP/s, 1,671 with sparsity, at its 400 W maximum; the same GH100 die at a lower
clock) and the H100 SXM (989.4 at 700 W). The HBM's clock is not the power limit's: its rate is not scaled.

Tensor parallelism in the ``fsdp`` layout is torchtitan's plan (its ``parallelize_llama``): the norms and the
residual stream run sequence-parallel (``SequenceParallel`` on the norms, the blocks' inputs and outputs sharded
on the sequence), so each of the ``tp`` ranks runs the token-wise element-wise kernels on 1/``tp`` of the tokens
(``evaluate``'s ``seq_split``); the collectives' bytes are Megatron-SP's all-gather and reduce-scatter, the
all-reduce's.

Measured time per step: tokens/s/GPU → global batch · seq / (value · GPUs); TFLOP/s/GPU → predicted time ·
predicted TFLOP/s / value, i.e. the source's FLOP count taken as perfmodel's (``Row.tflops_per_gpu``, recompute
not counted), which the row's note says.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np

from axgrid.spec import TransformerShape

from .errors import PerfModelError
from .machines import Machine, load_machine
from .model import evaluate
from .pipeline import MICROBATCH_SIZES, TPPPDP, VPP_CHOICES, check_config, price
from .problem import Options, Problem, model_flops
from .space import Grids

#: the suite's name in ``validate-public``
NAME = "llama-public"
#: datasheet HBM bandwidth (bytes/s) of the GPU each shipped machine file describes (NVIDIA's A100 80 GB SXM and
#: H100 SXM 80 GB datasheets): the base of a row's ``hbm_tbps`` scaling
DATASHEET_HBM = {"dgx-a100": 2039e9, "dgx-h100": 3350e9}
#: the share of the step that "selective" recompute runs again, between none (0) and full (1); module docstring
SELECTIVE_SHARE = 0.5
LAYOUTS = ("fsdp", "megatron", "fsdp-pp")
RECOMPUTE = {"none": 0.0, "full": 1.0, "selective-op": SELECTIVE_SHARE, "selective-layer": SELECTIVE_SHARE}
METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu")
#: memory multiplier that keeps a measured configuration priced when the memory model would reject it
_NO_MEMORY_LIMIT = 1e3


def llama_csv() -> Path:
    """The shipped table of public Llama-family measurements."""
    return Path(str(resources.files("axgrid.perfmodel") / "data" / "llama_public.csv"))


@dataclass(frozen=True)
class PublicRow:
    """One published measurement (a line of ``llama_public.csv``; the module docstring gives the columns'
    meaning). ``mbs`` 0: not published; ``fsdp`` 0: not an FSDP layout."""

    row: str
    model: str
    gpu: str
    machine: str
    gpus: int
    layout: str
    tp: int
    pp: int
    cp: int
    fsdp: int
    replicas: int
    mbs: int
    global_batch: int
    seq: int
    recompute: str
    compile: bool
    fp8: bool
    grad_reduce: str          # the dtype the gradients are reduced in ("" where not published: fp32)
    metric: str
    value: float
    inter_node_gbps_per_gpu: float
    hbm_tbps: float
    status: str
    note: str
    source: str
    peak_tflops_bf16: float = 0.0   # the GPU's dense bf16 peak at the row's power limit; 0: the machine file's

    @property
    def priced(self) -> bool:
        return self.status == "priced"

    @property
    def tokens(self) -> int:
        """Tokens per step."""
        return self.global_batch * self.seq

    @property
    def config(self) -> str:
        """The layout in words, e.g. ``FSDP 8`` or ``TP8xPP16xDP64``."""
        if self.layout == "megatron":
            return f"TP{self.tp}xPP{self.pp}xDP{self.replicas}" + (f" CP{self.cp}" if self.cp > 1 else "")
        words = ([f"TP {self.tp}"] if self.tp > 1 else []) + [f"FSDP {self.fsdp}"]
        words += [f"PP {self.pp}"] if self.pp > 1 else []
        words += [f"x{self.replicas} replicas"] if self.replicas > 1 else []
        return " ".join(words)


def _int(v: str) -> int:
    return int(v) if v.strip() else 0


def _float(v: str) -> float:
    return float(v) if v.strip() else 0.0


def read_rows(path: str | Path | None = None) -> list[PublicRow]:
    """The rows of ``path`` (default: the shipped table); a malformed row is a one-line PerfModelError naming
    it."""
    path = Path(path) if path else llama_csv()
    try:
        with open(path, encoding="utf-8", newline="") as f:
            raw = list(csv.DictReader(f))
    except OSError as e:
        raise PerfModelError(f"public Llama measurements {path}: {e.strerror or e}") from None
    out = []
    for r in raw:
        try:
            row = PublicRow(
                r["row"], r["model"], r["gpu"], r["machine"], int(r["gpus"]), r["layout"], _int(r["tp"]) or 1,
                _int(r["pp"]) or 1, _int(r["cp"]) or 1, _int(r["fsdp"]), _int(r["replicas"]) or 1, _int(r["mbs"]),
                int(r["global_batch"]), int(r["seq"]), r["recompute"], r["compile"] == "yes", r["fp8"] == "yes",
                r["grad_reduce"] or "fp32", r["metric"], float(r["value"]), _float(r["inter_node_gbps_per_gpu"]),
                _float(r["hbm_tbps"]), r["status"], r["note"], r["source"],
                _float(r.get("peak_tflops_bf16") or ""))
        except (KeyError, ValueError, TypeError) as e:
            raise PerfModelError(f"{path}: row {r.get('row', '?')!r} is malformed ({e!r})") from None
        bad = [f"{k} {v!r}" for k, v, ok in (
            ("layout", row.layout, row.layout in LAYOUTS), ("recompute", row.recompute, row.recompute in RECOMPUTE),
            ("metric", row.metric, row.metric in METRICS),
            ("grad_reduce", row.grad_reduce, row.grad_reduce in ("fp32", "bf16")),
            ("status", row.status, row.status in ("priced", "excluded")),
            ("value", row.value, row.value > 0), ("source", row.source, bool(row.source.strip())))
            if not ok]
        if bad:
            raise PerfModelError(f"{path}: row {row.row!r} has {', '.join(bad)}")
        if row.status == "excluded" and not row.note.strip():
            raise PerfModelError(f"{path}: row {row.row!r} is excluded without a reason in its note")
        out.append(row)
    return out


def row_machine(row: PublicRow, machine: Machine | None = None) -> Machine:
    """The row's machine file with the conditions the row states (module docstring), memory not limiting."""
    m = (machine or load_machine(row.machine)).scaled(memory=_NO_MEMORY_LIMIT)
    if row.inter_node_gbps_per_gpu > 0:
        m = replace(m, inter_node_bandwidth_per_nic=row.inter_node_gbps_per_gpu * 1e9 / 8,
                    nics_per_node=m.gpus_per_node, placement={k: v for k, v in m.placement.items() if k != "inter"},
                    bandwidth_table=tuple(b for b in m.bandwidth_table if b.placement != "inter"))
    if row.hbm_tbps > 0 and m.hbm_bandwidth > 0:
        if row.machine not in DATASHEET_HBM:
            raise PerfModelError(f"row {row.row!r}: no datasheet HBM figure for {row.machine} to scale from")
        m = replace(m, hbm_bandwidth=m.hbm_bandwidth * row.hbm_tbps * 1e12 / DATASHEET_HBM[row.machine])
    if row.peak_tflops_bf16 > 0:
        m = m.scaled(flops=row.peak_tflops_bf16 * 1e12 / m.peak_flops_bf16)
    return m


def row_problem(row: PublicRow, recompute: bool) -> Problem:
    """The row's problem: its model at its sequence, its global batch on its GPUs in bf16, no dropout, flash-style
    attention, the gradients reduced in the row's ``grad_reduce`` (torchtitan's FSDP2: fp32, its default
    reduce_dtype; fms-fsdp: bf16, its bfSixteen policy; not published: fp32)."""
    try:
        spec = TransformerShape.named(row.model)
    except ValueError as e:
        raise PerfModelError(f"row {row.row!r}: {e}") from None
    if spec.seq != row.seq:
        spec = replace(spec, seq=row.seq)
    local = row.global_batch // max(row.fsdp * row.replicas, 1)
    mb = local // row.mbs if row.layout == "fsdp" and row.mbs else None
    return Problem(spec, row.global_batch, row.gpus, "bf16",
                   Options(recompute=recompute, zero=0, microbatches=mb, dropout=False, fused_attention=True,
                           grad_reduce=row.grad_reduce))


def _fsdp_time(row: PublicRow, m: Machine, recompute: bool) -> tuple[float, float]:
    grid = (1, row.tp, row.fsdp, row.replicas)
    if row.tp * row.fsdp * row.replicas != row.gpus:
        raise PerfModelError(f"row {row.row!r}: TP·FSDP·replicas = {row.tp}·{row.fsdp}·{row.replicas} is not its "
                             f"{row.gpus} GPUs")
    ev = evaluate(row_problem(row, recompute), m, Grids.of([grid]), seq_split=row.tp)   # torchtitan's SP
    if not ev.feasible[0]:
        raise PerfModelError(f"row {row.row!r}: grid {'x'.join(map(str, grid))} rejected: {ev.reasons[0]}")
    return float(ev.time[0]), float(ev.tflops_per_gpu[0])


def _megatron_time(row: PublicRow, m: Machine, recompute: bool) -> tuple[float, float, str]:
    prob = row_problem(row, recompute)
    mode = "full" if recompute else "none"
    cands = [TPPPDP(row.tp, row.pp, row.replicas, mbs, vpp, sp=row.tp > 1, recompute=mode)
             for mbs in ([row.mbs] if row.mbs else MICROBATCH_SIZES) for vpp in VPP_CHOICES]
    cands = [c for c in cands if not check_config(prob, c)]
    if not cands:
        raise PerfModelError(f"row {row.row!r}: no TP{row.tp}xPP{row.pp}xDP{row.replicas} configuration perfmodel "
                             f"can price for {row.model}")
    best = min(price(prob, m, cands), key=lambda r: r.time_s)
    mbs = row.global_batch // (row.replicas * best.microbatches)
    return best.time_s, best.tflops_per_gpu, f"VPP {best.vpp}, micro-batch {mbs}"


def price_row(row: PublicRow, machine: Machine | None = None) -> tuple[float, float, str]:
    """(predicted seconds per step, predicted TFLOP/s per GPU, what was chosen where the row is silent) of a priced
    row; an excluded row raises."""
    if not row.priced:
        raise PerfModelError(f"row {row.row!r} is excluded: {row.note}")
    m = row_machine(row, machine)
    share = RECOMPUTE[row.recompute]
    parts = []
    for recompute, weight in ((False, 1.0 - share), (True, share)):
        if weight == 0:
            continue
        if row.layout == "fsdp":
            t, tf = _fsdp_time(row, m, recompute)
            chosen = ""
        elif row.layout == "megatron":
            t, tf, chosen = _megatron_time(row, m, recompute)
        else:
            raise PerfModelError(f"row {row.row!r}: layout {row.layout} (FSDP inside pipeline stages) is not priced")
        parts.append((weight, t, tf, chosen))
    time = sum(w * t for w, t, _, _ in parts)
    prob = row_problem(row, False)
    flops = model_flops(prob.model, prob.batch, False) / time / row.gpus / 1e12   # recompute not counted
    return time, flops, parts[-1][3]


def measured_seconds(row: PublicRow, predicted_s: float, predicted_tflops: float) -> float:
    """The row's measured seconds per step (module docstring)."""
    if row.metric == "tokens_per_s_per_gpu":
        return row.tokens / (row.value * row.gpus)
    return predicted_s * predicted_tflops / row.value


@dataclass(frozen=True)
class Priced:
    """A priced row: predicted and measured seconds per step."""

    row: PublicRow
    predicted_s: float
    measured_s: float
    chosen: str = ""

    @property
    def error(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s


def price_rows(rows: list[PublicRow]) -> tuple[list[Priced], list[PublicRow], list[tuple[PublicRow, str]]]:
    """(priced rows, excluded rows, rows marked priced that perfmodel refused, with its error), in the table's
    order."""
    machines: dict[str, Machine] = {}
    priced, excluded, failed = [], [], []
    for r in rows:
        if not r.priced:
            excluded.append(r)
            continue
        base = machines.setdefault(r.machine, load_machine(r.machine))
        try:
            t, tf, chosen = price_row(r, base)
        except PerfModelError as e:
            failed.append((r, str(e)))
            continue
        priced.append(Priced(r, t, measured_seconds(r, t, tf), chosen))
    return priced, excluded, failed


def mape(priced: list[Priced]) -> float:
    """Mean |predicted − measured| / measured of the rows, in percent."""
    if not priced:
        raise PerfModelError("no priced rows")
    return float(100 * np.mean([abs(p.error) for p in priced]))


__all__ = ["NAME", "DATASHEET_HBM", "SELECTIVE_SHARE", "PublicRow", "Priced", "llama_csv", "read_rows",
           "row_machine", "row_problem", "price_row", "measured_seconds", "price_rows", "mape"]
