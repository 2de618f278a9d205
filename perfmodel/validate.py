"""Validation: compare predicted with measured time per step over a set of configurations.

Metrics (``metrics``): Spearman ρ and Kendall τ (scipy.stats) between predicted and measured times; top-1 regret =
measured time of the predicted-best configuration ÷ the best measured time (1.0 = perfect); MAPE = mean
|predicted − measured| / measured in percent. Measuring needs the runtime (``measure_with_runtime``); measured
times from anywhere (CSV grid,seconds) go through ``validate_measured``."""
from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
from scipy import stats

from .calibrate import NEEDS_RUNTIME, runtime_available
from .errors import PerfModelError
from .rank import Ranking, Row


def metrics(predicted, measured) -> dict[str, float]:
    """{"spearman", "kendall", "top1_regret", "mape", "n"} for two equal-length sequences of seconds."""
    p = np.asarray(predicted, float)
    m = np.asarray(measured, float)
    if p.shape != m.shape or p.ndim != 1 or p.size < 2:
        raise PerfModelError(f"need two equal-length lists of ≥ 2 times, got {p.shape} and {m.shape}")
    if np.any(m <= 0) or not np.all(np.isfinite(p)):
        raise PerfModelError("measured times must be > 0 and predictions finite")
    rho = stats.spearmanr(p, m).statistic
    tau = stats.kendalltau(p, m).statistic
    return {"spearman": float(rho), "kendall": float(tau), "top1_regret": float(m[np.argmin(p)] / m.min()),
            "mape": float(100.0 * np.mean(np.abs(p - m) / m)), "n": int(p.size)}


def select_configs(rk: Ranking, top: int, sample: int, seed: int = 0) -> list[Row]:
    """Every feasible row when there are ≤ top + sample of them, else the top ``top`` plus ``sample`` drawn at
    random (seeded) from the rest."""
    feas = rk.feasible
    if len(feas) <= top + sample:
        return feas
    rest = feas[top:]
    return feas[:top] + random.Random(seed).sample(rest, sample)


def read_measured(path: str | Path) -> dict[str, float]:
    """CSV with columns grid (e.g. 2x2x1x2) and seconds → {grid: seconds}."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "grid" not in rows[0] or "seconds" not in rows[0]:
        raise PerfModelError(f"{path}: need a CSV with columns 'grid' and 'seconds'")
    return {r["grid"]: float(r["seconds"]) for r in rows}


def validate_measured(rk: Ranking, measured: dict[str, float], out_dir: str | Path | None = None,
                      meta: dict | None = None) -> dict[str, float]:
    """Metrics over the configurations present in both; writes validation.csv, summary.json (metrics + ``meta``)
    and validation.png (when matplotlib is installed) to ``out_dir``."""
    rows = [r for r in rk.feasible if r.grid_str in measured]
    if len(rows) < 2:
        raise PerfModelError(f"need ≥ 2 measured feasible configurations, found {len(rows)}")
    pred = [r.time_s for r in rows]
    meas = [measured[r.grid_str] for r in rows]
    res = metrics(pred, meas)
    if out_dir is not None:
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "validation.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["grid", "predicted_rank", "measured_rank", "microbatches", "predicted_s", "measured_s"])
            mrank = {i: j + 1 for j, i in enumerate(np.argsort(meas, kind="stable"))}
            for i, (r, m) in enumerate(zip(rows, meas)):
                w.writerow([r.grid_str, r.rank, mrank[i], r.microbatches, r.time_s, m])
        (d / "summary.json").write_text(json.dumps({**res, **(meta or {})}, indent=1))
        _plot(d / "validation.png", rows, meas, res)
    return res


def _plot(path: Path, rows: list[Row], meas: list[float], res: dict[str, float]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 5))
    pred = [r.time_s for r in rows]
    ax.scatter(pred, meas)
    for r, p, m in zip(rows, pred, meas):
        ax.annotate(r.grid_str, (p, m), fontsize=7)
    lo, hi = min(pred + meas), max(pred + meas)
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xlabel("predicted s/step")
    ax.set_ylabel("measured s/step")
    ax.set_title(f"ρ={res['spearman']:.2f} τ={res['kendall']:.2f} regret={res['top1_regret']:.2f} "
                 f"MAPE={res['mape']:.0f}%", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measure_with_runtime(rk: Ranking, rows: list[Row], steps: int = 3, warmup: int = 1, rounds: int = 2,
                         progress=None) -> dict[str, float]:
    """Run each configuration for a few steps through the runtime; returns {grid: seconds per step}.

    Plug point: ``axgrid.calibration.time_configs(model, grids, batch, dtype, microbatches, overlap, recompute,
    steps, warmup, rounds, bucket_bytes=...)`` (one pool of ranks for all configurations, interleaved rounds, best
    round kept). The run uses the problem's options as given -- the overlaps, activation recompute, keeping
    gathered weights and the data-parallel bucket size -- so what is timed is what was predicted."""
    if not runtime_available():
        raise PerfModelError(NEEDS_RUNTIME.replace("measuring", "validation (running configurations)"))
    import importlib
    try:
        mod = importlib.import_module("axgrid.calibration")
    except ImportError as e:
        raise PerfModelError(f"axgrid is importable but provides no axgrid.calibration.time_configs yet ({e})") from None
    p = rk.problem
    try:
        secs = mod.time_configs(model=p.model, grids=[r.grid for r in rows], batch=p.batch, dtype=p.dtype,
                                microbatches=[int(r.microbatches) for r in rows],
                                overlap=p.options.overlap_spec(), recompute=p.options.recompute, steps=steps,
                                warmup=warmup, rounds=rounds, progress=progress,
                                bucket_bytes=p.options.bucket_bytes)
    except ValueError as e:
        raise PerfModelError(f"validation run: {e}") from None
    return {r.grid_str: float(t) for r, t in zip(rows, secs)}


def workload_name() -> str:
    """What the runtime trains when validating (the GPT model, or the transformer-shaped stack)."""
    if not runtime_available():
        return "(runtime not available)"
    import importlib
    return importlib.import_module("axgrid.calibration").workload_name()
