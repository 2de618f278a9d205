"""Validation: compare predicted with measured time per step over a set of configurations.

Metrics (``metrics``): Spearman ρ and Kendall τ (scipy.stats) between predicted and measured times; top-1 regret =
measured time of the predicted-best configuration ÷ the best measured time (1.0 = perfect); MAPE = mean
|predicted − measured| / measured in percent. The measured times come from a file (``load_measured``): the JSON
that ``python -m axgrid.measure steps`` writes (it times the configurations ``select_configs`` picks, on real
ranks), or a CSV grid,seconds from anywhere."""
from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
from scipy import stats

from .errors import PerfModelError
from .rank import Ranking, Row
from .problem import Problem


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


MEASURE_COMMAND = ("axgrid launch -n {gpus} -- python -m axgrid.measure steps PROBLEM-ARGS "
                   "--out {path}")
#: The problem fields a measured file must agree on with the validation that reads it.
PROBLEM_KEYS = ("layers", "hidden", "heads", "seq", "vocab", "gpus", "batch", "dtype", "options", "recompute",
                "bucket_bytes")


def problem_meta(p: Problem) -> dict:
    """The problem's sizes and runtime options as plain values (written into measured files, checked on read)."""
    m = p.model
    return {"model": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "seq": m.seq,
            "vocab": m.vocab, "gpus": p.gpus, "batch": p.batch, "dtype": p.dtype,
            "options": p.options.overlap_spec(), "recompute": p.options.recompute,
            "bucket_bytes": p.options.bucket_bytes}


def load_measured(path: str | Path, problem: Problem) -> dict[str, float]:
    """{grid: seconds per step} from ``path``: the JSON of ``python -m axgrid.measure steps`` (its problem
    must be ``problem``) or a CSV with columns grid (e.g. 2x2x1x2) and seconds. A missing, malformed or mismatched
    file is a one-line PerfModelError naming it and the command that writes it."""
    fix = f"write it with `{MEASURE_COMMAND.format(gpus=problem.gpus, path=path)}` (the same problem arguments as here)"
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PerfModelError(f"measured step times {path}: {e.strerror or e}; {fix}") from None
    if str(path).endswith(".csv"):
        rows = list(csv.DictReader(text.splitlines()))
        if not rows or "grid" not in rows[0] or "seconds" not in rows[0]:
            raise PerfModelError(f"{path}: need a CSV with columns 'grid' and 'seconds'")
        return {r["grid"]: float(r["seconds"]) for r in rows}
    try:
        doc = json.loads(text)
        measured = {c["grid"]: float(c["seconds"]) for c in doc["configs"]}
        recorded = doc["problem"]
    except (ValueError, TypeError, KeyError) as e:
        raise PerfModelError(f"measured step times {path} are not axgrid.measure steps JSON ({e!r}); "
                             f"{fix}") from None
    want = problem_meta(problem)
    for k in PROBLEM_KEYS:
        if recorded.get(k) != want[k]:
            raise PerfModelError(f"{path} was measured with {k}={recorded.get(k)!r}, this validation has "
                                 f"{k}={want[k]!r}; {fix}")
    return measured


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


def write_validated_residuals(rk: Ranking, measured: dict[str, float]):
    """Store this validation's measured/predicted times as the machine's residuals (``perfmodel.band``: its error
    band), next to its TOML; earlier points of the same problem are replaced, other problems' kept. Returns the
    file."""
    from .band import Residual, read_residuals, residuals_path, write_residuals
    path = residuals_path(rk.machine)
    if path is None:
        raise PerfModelError(f"machine {rk.machine.name} has no file to store residuals next to; load it from a TOML")
    p = rk.problem
    key = f"{p.model.name} b{p.batch} {p.gpus} GPUs {p.dtype} {p.options.overlap_spec()}"
    new = [Residual(f"validate {key} {r.grid_str}", r.layout, p.gpus, r.grid_str, r.time_s, measured[r.grid_str],
                    problem=key) for r in rk.feasible if r.grid_str in measured]
    if not new:
        raise PerfModelError("no measured configuration is among the feasible ones: nothing to store")
    kept = [r for r in read_residuals(path) if r.problem != key]
    return write_residuals(path, rk.machine.name, kept + new,
                           "python -m axgrid.perfmodel validate PROBLEM-ARGS --measured FILE --write-residuals")


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
