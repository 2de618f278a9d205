"""Ranking: evaluate a search space, order feasible configurations by predicted time per batch (ties broken by
the grid tuple, so the order never depends on enumeration order), keep infeasible ones with their reasons, and
price the Megatron-style TP×PP×DP configurations (``perfmodel.pipeline``) alongside, so one table answers
"4D or TP×PP×DP, and which shape". With ``Options.zero`` None each 4D row is priced with the ``zero`` mode
that is fastest and fits there (``model.evaluate``; ``Row.zero``). Every feasible row carries the model's error
band on the machine (``perfmodel.band``): time_low / time_high, whether it is within model error of the best row,
and whether it lies outside the validated range."""
from __future__ import annotations

import csv
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from .band import Band, band_for, banded, separation, with_band
from .comm import GROUPS
from .errors import NoFeasibleConfig, PerfModelError
from .machines import Machine
from .model import Evaluation, evaluate
from .moe import ep_sizes
from .pipeline import best_of, enumerate_configs, price
from .space import Grids, enumerate_grids
from .row import Row
from .problem import Problem
from .units import device_word, flops


#: ``rank --layouts``: which layouts a table shows (axgrid runs the 4D grids; TP×PP×DP is priced for comparison).
LAYOUTS = {"4d": ("4D",), "tpppdp": ("TPxPPxDP",), "all": ("4D", "TPxPPxDP")}


@dataclass
class Ranking:
    """4D rows: feasible (best first, rank 1..) then infeasible (rank None); ``megatron``: the TP×PP×DP rows,
    likewise (ranked among themselves); ``combined``: the feasible rows of both, best first; ``band``: the error
    band the rows carry."""

    problem: Problem
    machine: Machine
    rows: list[Row]
    megatron: list[Row]
    band: Band | None = None

    @property
    def feasible(self) -> list[Row]:
        return [r for r in self.rows if r.feasible]

    @property
    def best(self) -> Row:
        return self.feasible[0]

    def top(self, k: int) -> list[Row]:
        return self.feasible[:k]

    @property
    def combined(self) -> list[Row]:
        """Feasible 4D and TP×PP×DP rows in one list by predicted time (ties: 4D first, then by name), one per
        configuration name (the best micro-batch size); a sequence-parallel row only when its time differs from
        the same configuration without (SP changes memory, not time, in this model)."""
        both = sorted((r for r in self.rows + self.megatron if r.feasible),
                      key=lambda r: (r.time_s, r.layout != "4D", r.grid_str))
        out, seen = [], {}
        for r in both:      # one row per configuration name (its best micro-batch size); SP only when it changes time
            if r.grid_str in seen:
                continue
            twin = seen.get(r.grid_str.replace("+SP", "")) if r.sp else None
            seen[r.grid_str] = r
            if twin is not None and twin.time_s == r.time_s:
                continue
            out.append(r)
        return out

    def shown(self, layouts: str = "all") -> list[Row]:
        """:attr:`combined` restricted to ``layouts``: "4d" (what axgrid runs), "tpppdp" (Megatron-style, for
        comparison) or "all"; the rows of the printed table, numbered from 1 in this order."""
        if layouts not in LAYOUTS:
            raise PerfModelError(f"--layouts {layouts}: use one of {', '.join(LAYOUTS)}")
        return [r for r in self.combined if r.layout in LAYOUTS[layouts]]

    def to_csv(self, path: str | Path) -> None:
        """Every row (4D, then TP×PP×DP); ``rank`` is the rank within its layout."""
        cols = ["rank", "grid", "zero", "feasible", "time_s", "time_low", "time_high", "within_error", "tflops_per_gpu",
                "pct_peak", "memory_gib", "microbatches", "compute_s"] + [f"exposed_{d}_s" for d in GROUPS] + [
                f"bytes_{d}" for d in GROUPS] + ["bubble_s", "p2p_s", "layout", "out_of_range", "reason"]
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for r in self.rows + self.megatron:
                w.writerow([r.rank, r.grid_str, r.zero, r.feasible, r.time_s, r.time_low, r.time_high, r.within_error,
                            r.tflops_per_gpu, r.pct_peak,
                            r.memory_bytes / 2**30, r.microbatches, r.compute_s]
                           + [r.exposed_s.get(d, 0.0) for d in GROUPS] + [r.step_bytes.get(d, 0.0) for d in GROUPS]
                           + [r.bubble_s, r.p2p_s, r.layout, r.out_of_range, r.reason])

    def to_json(self, path: str | Path) -> None:
        p = self.problem
        doc = {"model": asdict(p.model), "batch": p.batch, "gpus": p.gpus, "dtype": p.dtype,
               "options": asdict(p.options), "machine": self.machine.name,
               "band": self.band.describe() if self.band else None,
               "rows": [row_json(r) for r in self.rows], "tp_pp_dp": [row_json(r) for r in self.megatron]}
        Path(path).write_text(json.dumps(doc, indent=1))


def row_json(r: Row) -> dict:
    """A row as JSON-ready data (grid as its string, infinite times as null)."""
    d = asdict(r)
    d["grid"] = r.grid_str
    for k in ("time_s", "time_low", "time_high"):
        d[k] = None if not np.isfinite(d[k]) else d[k]
    return d


def _rows(ev: Evaluation, order: np.ndarray, ranked: bool) -> list[Row]:
    tuples = ev.grids.tuples()
    L = {k: np.asarray(v)[order].tolist() for k, v in {
        "tf": ev.tflops_per_gpu, "pp": ev.pct_peak, "ok": ev.feasible, "time": ev.time, "mem": ev.memory.total,
        "mb": ev.microbatches, "comp": ev.compute, "static": ev.memory.static, "buf": ev.memory.buffers,
        "act": ev.memory.activations, "dpb": ev.extra.get("dp_buckets", np.zeros(len(ev.grids))),
        "ew": ev.extra.get("elementwise", np.zeros(len(ev.grids))),
        "zero": ev.extra.get("zero", np.zeros(len(ev.grids), dtype=np.int64)), "ep": ev.grids.eps,
        "a2a": ev.extra.get("all_to_all", np.zeros(len(ev.grids))),
        "a2a_bytes": ev.extra.get("all_to_all_bytes", np.zeros(len(ev.grids)))}.items()}
    groups = GROUPS + tuple(k for k in ev.exposed if k not in GROUPS)       # "c" under context parallelism
    ex = {d: np.asarray(ev.exposed[d])[order].tolist() for d in groups}
    rw = {d: np.asarray(ev.raw[d])[order].tolist() for d in groups}
    sb = {d: np.asarray(ev.step_bytes[d])[order].tolist() for d in groups if d in ev.step_bytes}
    out = []
    for pos, i in enumerate(order.tolist()):
        ok = L["ok"][pos]
        out.append(Row(
            rank=pos + 1 if (ranked and ok) else None, grid=tuples[i], feasible=ok, reason=ev.reasons[i],
            time_s=L["time"][pos], tflops_per_gpu=L["tf"][pos] if ok else 0.0, pct_peak=L["pp"][pos] if ok else 0.0,
            memory_bytes=L["mem"][pos], microbatches=L["mb"][pos], compute_s=L["comp"][pos],
            exposed_s={d: ex[d][pos] for d in groups}, raw_comm_s={d: rw[d][pos] for d in groups},
            step_bytes={d: sb[d][pos] for d in sb},
            memory_parts={"static": L["static"][pos], "buffers": L["buf"][pos], "activations": L["act"][pos]},
            dp_buckets=int(L["dpb"][pos]), elementwise_s=L["ew"][pos], zero=int(L["zero"][pos]), ep=int(L["ep"][pos]),
            all_to_all_s=L["a2a"][pos], all_to_all_bytes=L["a2a_bytes"][pos]))
    return out


def order_of(ev: Evaluation) -> np.ndarray:
    """Indices: feasible by (time, gx, gy, gz, gd), then infeasible by grid tuple."""
    g = ev.grids
    return np.lexsort((g.eps, g.gd, g.gz, g.gy, g.gx, ev.time, ~ev.feasible))


def _ranked(rows: list[Row]) -> list[Row]:
    """TP×PP×DP rows best first with ranks 1.. on the feasible ones."""
    rows = best_of(rows)
    return [replace(r, rank=i + 1) if r.feasible else r for i, r in enumerate(rows)]


def _rows_over_cp(prob: Problem, machine: Machine, grids: Grids, cp_sizes: Sequence[int]) -> list[Row]:
    """The 4D rows of every context-parallel size in ``cp_sizes`` that cuts the sequence into ``2·cp`` chunks
    (each priced with ``Options.cp``; a grid whose Gz the size does not divide is left out for that size), feasible
    ones ranked together by time, then the rejected ones."""
    rows: list[Row] = []
    for c in sorted(set(int(v) for v in cp_sizes)):
        if c < 1 or (c > 1 and prob.model.seq % (2 * c)):
            continue
        keep = np.nonzero(grids.gz % c == 0)[0]
        if not len(keep):
            continue
        ev = evaluate(replace(prob, options=prob.options.with_(cp=c)), machine, grids.take(keep))
        rows += [replace(r, cp=c) for r in _rows(ev, order_of(ev), ranked=False)]
    rows.sort(key=lambda r: (not r.feasible, r.time_s if r.feasible else 0.0, r.grid, r.cp))
    return [replace(r, rank=i + 1) if r.feasible else r for i, r in enumerate(rows)]


def context_parallel_sizes(prob: Problem) -> list[int]:
    """The context-parallel sizes ``rank`` searches (``--cp auto``): every divisor of the GPUs that cuts the
    sequence into ``2·cp`` equal chunks (a grid takes those dividing its Gz)."""
    return [c for c in range(1, prob.gpus + 1) if prob.gpus % c == 0 and (c == 1 or prob.model.seq % (2 * c) == 0)]


def rank(prob: Problem, machine: Machine, grids: Grids | None = None, require_feasible: bool = True,
         tp_pp_dp: bool = True, cp_sizes: Sequence[int] | None = None) -> Ranking:
    """Rank every configuration (all factorisations of prob.gpus unless ``grids`` is given), and (unless
    ``tp_pp_dp`` is False) every Megatron-style TP×PP×DP configuration (``pipeline.enumerate_configs``).
    ``cp_sizes``: search these context-parallel sizes too (:func:`context_parallel_sizes`; each 4D row then
    carries its ``cp``); None: ``prob.options.cp`` alone.

    Raises NoFeasibleConfig (with a summary of the reasons) when no 4D grid is feasible and ``require_feasible``."""
    if grids is None:
        grids = enumerate_grids(prob.gpus)
        if prob.model.is_moe:                          # every EP size of each grid (perfmodel.moe)
            grids = grids.with_expert_parallel(lambda gd: ep_sizes(prob.model, gd))
    tp_pp_dp = tp_pp_dp and not prob.options.lora_r and not prob.model.is_moe      # Megatron's layout is priced for full training only
    if cp_sizes is None:
        ev = evaluate(prob, machine, grids)
        order = order_of(ev)
        rows = [replace(r, cp=prob.options.cp) for r in _rows(ev, order, ranked=True)]
    else:
        rows = _rows_over_cp(prob, machine, grids, cp_sizes)
    if require_feasible and not any(r.feasible for r in rows):
        raise NoFeasibleConfig(
            f"no feasible grid for {prob.model.name} with batch {prob.batch} on {prob.gpus} GPUs of {machine.name} "
            f"({len(rows)} factorisations tried): {summarize_reasons([r.reason for r in rows])}; "
            f"{what_would_fit(prob, machine)}")
    mrows = _ranked(price(prob, machine, enumerate_configs(prob, machine))) if tp_pp_dp else []
    band = band_for(machine)
    best = min((r.time_s for r in rows + mrows if r.feasible), default=np.inf)
    best_high = best * band.hi
    return Ranking(prob, machine, with_band(rows, band, best_high, prob.gpus),
                   with_band(mrows, band, best_high, prob.gpus), band)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def summarize_reasons(reasons: list[str]) -> str:
    """The reasons of rejected grids grouped by kind, most frequent first, with their real numbers: a number that
    differs between grids of a kind as its range, e.g. ``35× memory 45.1–1451.0 GiB > 36.0 GiB usable``."""
    groups: dict[str, list[list[str]]] = {}
    for reason in reasons:
        for part in reason.split("; "):
            part = part.split(" (with")[0]
            groups.setdefault(_NUMBER.sub("\0", part), []).append(_NUMBER.findall(part))
    out = []
    for key, numbers in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        slots = []
        for column in zip(*numbers):
            lo, hi = min(column, key=float), max(column, key=float)
            slots.append(lo if float(lo) == float(hi) else f"{lo}–{hi}")
        pieces = key.split("\0")
        text = "".join(p + (slots[i] if i < len(slots) else "") for i, p in enumerate(pieces))
        out.append(f"{len(numbers)}× {text}")
    return "; ".join(out)


def _fits(prob: Problem, machine: Machine) -> Row | None:
    """The best feasible 4D row of ``prob`` on ``machine``, or None."""
    ev = evaluate(prob, machine, enumerate_grids(prob.gpus))
    if not ev.feasible.any():
        return None
    return _rows(ev, order_of(ev), ranked=True)[0]


#: the prime factors of the nearby GPU counts ``what_would_fit`` tries (a count with a larger prime factor seldom
#: splits a model's hidden size, heads and batch)
NEARBY_PRIMES = (2, 3, 5, 7)


def nearby_counts(gpus: int, most: int = 24) -> tuple[list[int], list[int]]:
    """(above, below): the GPU counts in (gpus, 2·gpus] ascending and in [gpus/2, gpus) descending whose prime
    factors are all in :data:`NEARBY_PRIMES`, at most ``most`` of each, nearest first."""
    def smooth(n: int) -> bool:
        for q in NEARBY_PRIMES:
            while n % q == 0:
                n //= q
        return n == 1
    above = [n for n in range(gpus + 1, 2 * gpus + 1) if smooth(n)][:most]
    below = [n for n in range(gpus - 1, max(gpus // 2, 1) - 1, -1) if smooth(n)][:most]
    return above, below


def what_would_fit(prob: Problem, machine: Machine, max_factor: int = 1024) -> str:
    """What to change so that a 4D grid fits: the nearest GPU counts with a feasible grid, above and below
    ``prob.gpus`` (:func:`nearby_counts`; above 2·gpus the doublings ``prob.gpus·2^k``, up to ``max_factor`` times
    as many), and the smallest batch above ``prob.batch`` (a multiple of one of the GPU count's divisors, up to 8
    times the batch) that has one on ``prob.gpus`` GPUs."""
    found = []
    above, below = nearby_counts(prob.gpus)
    tried = [*above, *(prob.gpus << k for k in range(2, max_factor.bit_length()))]
    for n in tried:
        row = _fits(replace(prob, gpus=n), machine)
        if row is not None:
            found.append(f"the nearest larger GPU count that fits is {n} ({row.grid_str}, {row.time_s:.3g} s/batch, "
                         f"{row.memory_bytes / 2**30:.1f} GiB/GPU)")
            break
    else:
        found.append(f"no count up to {prob.gpus * max_factor} GPUs fits")
    for n in below:
        row = _fits(replace(prob, gpus=n), machine)
        if row is not None:
            found.append(f"the nearest smaller one is {n} ({row.grid_str}, {row.time_s:.3g} s/batch)")
            break
    found[-1] += (f" (counts tried: those up to {2 * prob.gpus} and down to {max(prob.gpus // 2, 1)} whose prime "
                  f"factors are {', '.join(map(str, NEARBY_PRIMES))}, then doublings)")
    candidates = sorted({-(-prob.batch // m) * m for m in range(2, prob.gpus + 1) if prob.gpus % m == 0} - {prob.batch})
    for b in (c for c in candidates if c <= 8 * prob.batch):
        if prob.options.microbatches is not None and b % prob.options.microbatches:
            continue
        row = _fits(replace(prob, batch=b), machine)
        if row is not None:
            found.append(f"on {prob.gpus} GPUs the smallest larger batch that fits is {b} ({row.grid_str})")
            break
    return "; ".join(found)


def verdict(rk: Ranking, layouts: str = "all") -> str:
    """With ``layouts`` "all", the 4D against TP×PP×DP line (:func:`layout_verdict`); then which rows of the table
    (``rk.shown(layouts)``, numbered as printed) the model can tell apart from row 1 (``band.separation``)."""
    line = layout_verdict(rk) if layouts == "all" else ""
    rows = rk.shown(layouts)
    told = separation([r.time_s for r in rows], rk.band) if rk.band is not None else ""
    return "\n".join(x for x in (line, told) if x)


def layout_verdict(rk: Ranking) -> str:
    """The 4D against TP×PP×DP line: the best of each, which is faster and by how much, and whether that
    difference is larger than the model's error band on the machine (the two bests' bands do not overlap)."""
    best4 = rk.feasible[0] if rk.feasible else None
    bestm = next((r for r in rk.megatron if r.feasible), None)
    if not (best4 and bestm):
        return f"no feasible {'TP×PP×DP configuration' if best4 else '4D grid'}" if (best4 or bestm) else ""
    fast, slow = (best4, bestm) if best4.time_s <= bestm.time_s else (bestm, best4)
    per = device_word(rk.machine)
    head = (f"best 4D {best4.grid_str}: {flops(best4.tflops_per_gpu, per)}; best TP×PP×DP {bestm.grid_str}: "
            f"{flops(bestm.tflops_per_gpu, per)}; {fast.layout} is {slow.time_s / fast.time_s:.2f}× faster")
    bands = (f"bands {fast.time_low:.3g}–{fast.time_high:.3g} s and {slow.time_low:.3g}–{slow.time_high:.3g} s")
    if slow.time_low > fast.time_high:
        return f"{head}, a difference larger than the model's error band ({bands} do not overlap)"
    return (f"{head}, a difference within the model's error band ({bands} overlap): the model cannot tell "
            f"them apart")


def price_grid(prob: Problem, machine: Machine, grid: tuple[int, int, int, int], ep: int = 1) -> Row:
    """One named 4D grid (with expert-parallel size ``ep``), priced (feasible or not, with the reason) with the
    machine's error band; rank None."""
    gx, gy, gz, gd = grid
    if gx * gy * gz * gd != prob.gpus:
        raise PerfModelError(f"grid {'x'.join(map(str, grid))} has {gx * gy * gz * gd} GPUs, not --gpus "
                             f"{prob.gpus}")
    ev = evaluate(prob, machine, Grids.of([tuple(grid) + (ep,)]))
    return banded(replace(_rows(ev, np.array([0]), ranked=False)[0], cp=prob.options.cp), machine, prob.gpus)
