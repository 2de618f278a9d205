"""Ranking: evaluate a search space, order feasible configurations by predicted time per batch (ties broken by
the grid tuple, so the order never depends on enumeration order), keep infeasible ones with their reasons, and
price the Megatron-style 1D tensor-parallel layout (TP degree t inside a node × data parallel) alongside."""
from __future__ import annotations

import csv
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .comm import DIMS
from .errors import NoFeasibleConfig
from .machines import Machine
from .model import Evaluation, evaluate
from .space import Grids, divisors, enumerate_grids
from .spec import Problem


@dataclass(frozen=True)
class Row:
    """One configuration. Times in seconds per batch, memory in bytes per GPU, bytes per step per dimension."""

    rank: int | None
    grid: tuple[int, int, int, int]
    feasible: bool
    reason: str
    time_s: float
    tflops_per_gpu: float
    pct_peak: float
    memory_bytes: float
    microbatches: int
    compute_s: float
    exposed_s: dict[str, float] = field(default_factory=dict)
    raw_comm_s: dict[str, float] = field(default_factory=dict)
    step_bytes: dict[str, float] = field(default_factory=dict)
    memory_parts: dict[str, float] = field(default_factory=dict)
    dp_buckets: int = 0  # data-parallel all-reduces per step (gradient buckets; 0 when Gd = 1)

    @property
    def grid_str(self) -> str:
        return "x".join(str(v) for v in self.grid)


@dataclass
class Ranking:
    """Feasible rows (best first, rank 1..) followed by infeasible rows (rank None)."""

    problem: Problem
    machine: Machine
    rows: list[Row]
    megatron: list[Row]

    @property
    def feasible(self) -> list[Row]:
        return [r for r in self.rows if r.feasible]

    @property
    def best(self) -> Row:
        return self.feasible[0]

    def top(self, k: int) -> list[Row]:
        return self.feasible[:k]

    def to_csv(self, path: str | Path) -> None:
        cols = ["rank", "grid", "feasible", "time_s", "tflops_per_gpu", "pct_peak", "memory_gib", "microbatches",
                "compute_s"] + [f"exposed_{d}_s" for d in DIMS] + [f"bytes_{d}" for d in DIMS] + ["reason"]
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for r in self.rows:
                w.writerow([r.rank, r.grid_str, r.feasible, r.time_s, r.tflops_per_gpu, r.pct_peak,
                            r.memory_bytes / 2**30, r.microbatches, r.compute_s]
                           + [r.exposed_s.get(d, 0.0) for d in DIMS] + [r.step_bytes.get(d, 0.0) for d in DIMS]
                           + [r.reason])

    def to_json(self, path: str | Path) -> None:
        def clean(r: Row) -> dict:
            d = asdict(r)
            d["grid"] = r.grid_str
            d["time_s"] = None if not np.isfinite(r.time_s) else r.time_s
            return d
        p = self.problem
        doc = {"model": asdict(p.model), "batch": p.batch, "gpus": p.gpus, "dtype": p.dtype,
               "options": asdict(p.options), "machine": self.machine.name,
               "rows": [clean(r) for r in self.rows], "megatron_1d": [clean(r) for r in self.megatron]}
        Path(path).write_text(json.dumps(doc, indent=1))


def _rows(ev: Evaluation, order: np.ndarray, ranked: bool) -> list[Row]:
    tuples = ev.grids.tuples()
    L = {k: np.asarray(v)[order].tolist() for k, v in {
        "tf": ev.tflops_per_gpu, "pp": ev.pct_peak, "ok": ev.feasible, "time": ev.time, "mem": ev.memory.total,
        "mb": ev.microbatches, "comp": ev.compute, "static": ev.memory.static, "buf": ev.memory.buffers,
        "act": ev.memory.activations, "dpb": ev.extra.get("dp_buckets", np.zeros(len(ev.grids)))}.items()}
    ex = {d: np.asarray(ev.exposed[d])[order].tolist() for d in DIMS}
    rw = {d: np.asarray(ev.raw[d])[order].tolist() for d in DIMS}
    sb = {d: np.asarray(ev.step_bytes[d])[order].tolist() for d in DIMS}
    out = []
    for pos, i in enumerate(order.tolist()):
        ok = L["ok"][pos]
        out.append(Row(
            rank=pos + 1 if (ranked and ok) else None, grid=tuples[i], feasible=ok, reason=ev.reasons[i],
            time_s=L["time"][pos], tflops_per_gpu=L["tf"][pos] if ok else 0.0, pct_peak=L["pp"][pos] if ok else 0.0,
            memory_bytes=L["mem"][pos], microbatches=L["mb"][pos], compute_s=L["comp"][pos],
            exposed_s={d: ex[d][pos] for d in DIMS}, raw_comm_s={d: rw[d][pos] for d in DIMS},
            step_bytes={d: sb[d][pos] for d in DIMS},
            memory_parts={"static": L["static"][pos], "buffers": L["buf"][pos], "activations": L["act"][pos]},
            dp_buckets=int(L["dpb"][pos])))
    return out


def order_of(ev: Evaluation) -> np.ndarray:
    """Indices: feasible by (time, gx, gy, gz, gd), then infeasible by grid tuple."""
    g = ev.grids
    return np.lexsort((g.gd, g.gz, g.gy, g.gx, ev.time, ~ev.feasible))


def megatron_grids(prob: Problem, machine: Machine) -> Grids:
    """1D tensor parallel inside a node: grids (1, t, 1, G/t) for t dividing gpus_per_node, heads and G."""
    ts = [int(t) for t in divisors(machine.gpus_per_node) if prob.gpus % t == 0 and prob.model.heads % t == 0]
    return Grids.of([(1, t, 1, prob.gpus // t) for t in ts])


def rank(prob: Problem, machine: Machine, grids: Grids | None = None, require_feasible: bool = True) -> Ranking:
    """Rank every configuration (all factorisations of prob.gpus unless ``grids`` is given).

    Raises NoFeasibleConfig (with a summary of the reasons) when nothing is feasible and ``require_feasible``."""
    grids = enumerate_grids(prob.gpus) if grids is None else grids
    ev = evaluate(prob, machine, grids)
    order = order_of(ev)
    rows = _rows(ev, order, ranked=True)
    if require_feasible and not any(r.feasible for r in rows):
        counts: dict[str, int] = {}
        for r in rows:
            for part in r.reason.split("; "):
                key = re.sub(r"\d+(\.\d+)?", "N", part.split(" (with")[0])
                counts[key] = counts.get(key, 0) + 1
        summary = "; ".join(f"{n}× {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        raise NoFeasibleConfig(
            f"no feasible grid for {prob.model.name} with batch {prob.batch} on {prob.gpus} GPUs of {machine.name} "
            f"({len(rows)} factorisations tried): {summary}")
    mg = megatron_grids(prob, machine)
    mprob = Problem(prob.model, prob.batch, prob.gpus, prob.dtype, prob.options.with_(zero1_over_d=True))
    mev = evaluate(mprob, machine, mg)
    return Ranking(prob, machine, rows, _rows(mev, order_of(mev), ranked=True))
