"""Public validation suites: perfmodel against measurements nobody here made (``python -m axgrid.perfmodel
validate-public``).

Five suites, each row priced at its exact configuration (``pipeline.price``, what ``price_named`` runs, or one 4D
grid) on the shipped machine file, memory not limiting (the runs were made, so they fitted):

* ``vtrain``: vTrain's 1,440 single-node Megatron-LM runs (``data/vtrain_ground_truth_single.csv``, its README
  names the source): 2, 4 or 8 A100s of ``dgx-a100``, TP × PP × DP at a micro-batch size, fp16, full activation
  recompute, 1F1B (no interleaving, no sequence parallel), sequence 1024, vocabulary 51,200 (``VTRAIN_VOCAB``),
  Megatron-LM's dropout and unfused softmax (``Options.dropout`` / ``fused_attention``), fp16 gradient reduction;
* ``korthikanti``: the eight Korthikanti et al. 2022 configurations (``published.POINTS``, time points);
* ``published``: check-published's fifteen points (``published.check_all``);
* ``llama-public``: Llama-family bf16 training on H100 and A100 measured by others (torchtitan, IBM's fms-fsdp,
  Meta's Llama 3 paper; ``data/llama_public.csv``, ``perfmodel.llama_suite``), each priced at its published layout
  (FSDP as the 4D grid (1, TP, FSDP, replicas), or TP × PP × DP); rows whose conditions are not modelled (FP8,
  torch.compile, context parallelism, an unpublished recompute parameter) are listed with the reason, not priced;
* ``frontier-public``: every public per-configuration Frontier measurement held (``perfmodel.weak_scaling``): the
  AxoNN SC24 weak-scaling points whose throughput the paper's text gives (512, 8,192, 16,384 and 32,768 GCDs; the
  last is check-published's "SC24 Frontier 320B") on the best 4D grid, and the Frontier study's three points
  (Megatron-DeepSpeed, check-published's) on the best TP×PP×DP without interleaving; a throughput point's
  measured time is the predicted time × predicted / published TFLOP/s. Its rows are not configurations a user
  chooses between (one run per scale), so it has no groups: no ρ or regret. Nothing is fitted on it;
* ``vtrain-multi``: vTrain's 109 multi-node runs (``data/vtrain_ground_truth_multi.csv``: 64 to 512 A100s of
  ``dgx-a100``, sequence 2048, otherwise as ``vtrain``), the held-out test: priced, never fitted or tuned on
  (``experiments/perfmodel/fit_kernel_latency.py`` reads the single-node file only).

Metrics (``suite_metrics``): MAPE = mean |predicted − measured| / measured in percent; the median of that error;
the share within ±15% (|predicted − measured| ≤ 15% of measured; check-published's own criterion,
|measured/predicted − 1| ≤ 15%, is ``ratio_within_n``); the median measured/predicted ratio (> 1: optimistic); within each group of rows that a
user would choose between (vTrain: same GPUs, global batch and model shape) with at least ``MIN_GROUP`` rows,
Spearman's ρ of predicted vs measured time (mean over the groups where it is defined: a group whose predictions are
all equal has none, and is counted apart) and the top-1 regret = measured time of the predicted-best row / the best
measured (a tie for the predicted best is a coin toss: the mean of the tied rows' measured times), mean and worst.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from axgrid.spec import TransformerShape

from .errors import PerfModelError
from .machines import Machine, load_machine
from .pipeline import TPPPDP, price
from .problem import Options, Problem

#: the share of rows within this relative error is reported
WITHIN = 0.15
#: a group needs this many rows for its ρ and regret to count
MIN_GROUP = 3
#: vocabulary of vTrain's runs (Megatron-LM's GPT-2 vocabulary padded to 51,200, as the Korthikanti points)
VTRAIN_VOCAB = 51200
#: memory multiplier that keeps a measured configuration priced when the memory model would reject it
_NO_MEMORY_LIMIT = 1e3
SUITES = ("vtrain", "korthikanti", "published", "llama-public", "vtrain-multi", "frontier-public")


def vtrain_csv(nodes: str = "single") -> Path:
    """The shipped copy of vTrain's ground truth, ``nodes`` "single" (1,440 runs) or "multi" (109 runs)."""
    return Path(str(resources.files("axgrid.perfmodel") / "data" / f"vtrain_ground_truth_{nodes}.csv"))


@dataclass
class SuiteResult:
    """One suite priced: per row its name, group key, predicted and measured seconds."""

    name: str
    labels: list[str]
    groups: list[tuple]
    predicted: np.ndarray
    measured: np.ndarray
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)     # printed under the summary: rows left out and why
    machines: list[str] = field(default_factory=list)  # per row: the machine file it was priced on ([]: one machine)
    layouts: list[str] = field(default_factory=list)   # per row: "4D" or "TPxPPxDP"
    gpus: list[int] = field(default_factory=list)      # per row: its GPUs


def _top1_regret(pred: np.ndarray, meas: np.ndarray) -> float:
    tied = np.isclose(pred, pred.min(), rtol=1e-9, atol=0.0)
    return float(meas[tied].mean() / meas.min())


def suite_metrics(predicted, measured, groups: list[tuple] | None = None) -> dict[str, float]:
    """The module docstring's metrics for rows of ``predicted`` and ``measured`` seconds, ``groups`` their group
    keys (None: one group per row, so no ρ or regret)."""
    from scipy import stats        # scipy loads in ~1 s: only the Spearman figures need it
    p = np.asarray(predicted, float)
    m = np.asarray(measured, float)
    if p.shape != m.shape or p.ndim != 1 or p.size == 0:
        raise PerfModelError(f"need two equal-length lists of times, got {p.shape} and {m.shape}")
    if np.any(m <= 0) or not np.all(np.isfinite(p)) or np.any(p <= 0):
        raise PerfModelError("measured and predicted times must be finite and > 0")
    err = np.abs(p - m) / m
    out = {"n": int(p.size), "mape": float(100 * err.mean()), "median_error": float(100 * np.median(err)),
           "within": float(np.mean(err <= WITHIN)), "within_n": int(np.sum(err <= WITHIN)),
           "ratio_within_n": int(np.sum(np.abs(m / p - 1) <= WITHIN)), "ratio_median": float(np.median(m / p)), "groups": 0, "groups_tied": 0,
           "spearman": float("nan"), "regret_mean": float("nan"), "regret_worst": float("nan")}
    by: dict[tuple, list[int]] = {}
    for i, g in enumerate(groups or [(i,) for i in range(p.size)]):
        by.setdefault(g, []).append(i)
    rhos, regrets = [], []
    for idx in by.values():
        if len(idx) < MIN_GROUP:
            continue
        gp, gm = p[idx], m[idx]
        regrets.append(_top1_regret(gp, gm))
        if np.ptp(gp) == 0:
            out["groups_tied"] += 1
            continue
        rhos.append(float(stats.spearmanr(gp, gm).statistic))
    if regrets:
        out.update(groups=len(regrets), spearman=float(np.mean(rhos)) if rhos else float("nan"),
                   regret_mean=float(np.mean(regrets)), regret_worst=float(np.max(regrets)))
    return out


def vtrain_rows(path: str | Path | None = None) -> list[dict[str, int | float]]:
    """vTrain's CSV as dicts: gpus, batch, mbs, hidden, heads, layers, seq, tp, dp, pp (int), ms (float); the
    multi-node file's leading column (parameters, billions) is dropped."""
    path = Path(path) if path else vtrain_csv()
    keys = ("gpus", "batch", "mbs", "hidden", "heads", "layers", "seq", "tp", "dp", "pp")
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            lines = [r for r in csv.reader(f) if r]
    except OSError as e:
        raise PerfModelError(f"vTrain ground truth {path}: {e.strerror or e}; give vTrain's "
                             f"data/ground_truth_single.csv") from None
    if lines and len(lines[0]) == len(keys) + 2 and lines[0][0].startswith("Parameters"):
        lines = [r[1:] for r in lines]
    if not lines or len(lines[0]) != len(keys) + 1:
        raise PerfModelError(f"{path}: expected vTrain's 11 columns (GPUs … iteration time (ms))")
    out = []
    for r in lines[1:]:
        row: dict[str, int | float] = {k: int(v) for k, v in zip(keys, r)}
        row["ms"] = float(r[-1])
        out.append(row)
    return out


def vtrain_problem(r: dict, vocab: int = VTRAIN_VOCAB) -> Problem:
    """The problem of one vTrain row (module docstring)."""
    return Problem(TransformerShape.from_vtrain_row(r, vocab), int(r["batch"]), int(r["gpus"]), "fp16",
                   Options(dropout=True, fused_attention=False, grad_reduce="fp16"))


def price_vtrain(path: str | Path | None = None, machine: str | Machine = "dgx-a100",
                 name: str = "vtrain") -> SuiteResult:
    """Every vTrain row of ``path`` (default: the single-node file) priced at its configuration on ``machine`` (a
    name or a :class:`Machine`), as suite ``name``; one ``pipeline.price`` call per problem."""
    rows = vtrain_rows(path)
    m = (machine if isinstance(machine, Machine) else load_machine(machine)).scaled(memory=_NO_MEMORY_LIMIT)
    by: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        by.setdefault((r["gpus"], r["batch"], r["hidden"], r["heads"], r["layers"], r["seq"]), []).append(i)
    pred = np.empty(len(rows))
    for idx in by.values():
        prob = vtrain_problem(rows[idx[0]])
        cs = [TPPPDP(int(rows[i]["tp"]), int(rows[i]["pp"]), int(rows[i]["dp"]), int(rows[i]["mbs"]),
                     recompute="full") for i in idx]
        for i, row in zip(idx, price(prob, m, cs)):
            pred[i] = row.time_s
    labels = [f"{r['gpus']} GPUs b{r['batch']} h{r['hidden']} a{r['heads']} L{r['layers']} TP{r['tp']}xPP{r['pp']}"
              f"xDP{r['dp']} mbs{r['mbs']}" for r in rows]
    groups = [(r["gpus"], r["batch"], r["hidden"], r["heads"], r["layers"], r["seq"]) for r in rows]
    return SuiteResult(name, labels, groups, pred, np.array([r["ms"] / 1e3 for r in rows]),
                       layouts=["TPxPPxDP"] * len(rows), gpus=[int(r["gpus"]) for r in rows])


def price_published(korthikanti_only: bool = False, checks=None) -> SuiteResult:
    """check-published's points as a suite (time: the published seconds, or for a throughput point the predicted
    time × predicted / published TFLOP/s); ``korthikanti_only``: its eight Korthikanti configurations."""
    from .published import check_all
    cs = [c for c in (checks or check_all()) if not korthikanti_only or c.point.name.startswith("Korthikanti")]
    pred = np.array([c.predicted.time_s for c in cs])
    return SuiteResult("korthikanti" if korthikanti_only else "published", [c.point.name for c in cs],
                       [(c.point.name,) for c in cs], pred, pred * np.array([c.ratio for c in cs]),
                       machines=[c.point.machine for c in cs], layouts=[c.predicted.layout for c in cs],
                       gpus=[c.point.gpus for c in cs])


def price_llama(path: str | Path | None = None) -> SuiteResult:
    """The ``llama-public`` suite (``perfmodel.llama_suite``): its priced rows, and one note per excluded row."""
    from .llama_suite import NAME, price_rows, read_rows
    priced, excluded, failed = price_rows(read_rows(path))
    if not priced:
        raise PerfModelError("no llama-public row could be priced: "
                             + "; ".join(f"{r.row}: {why}" for r, why in failed[:3]))
    labels = [f"{p.row.row}: {p.row.model} {p.row.gpus}x{p.row.gpu} {p.row.config} b{p.row.global_batch}x{p.row.seq} "
              f"{p.row.recompute}" + (f" ({p.chosen})" if p.chosen else "") for p in priced]
    notes = ([f"NOT PRICED {r.row} (marked priced; perfmodel refused it): {why}" for r, why in failed]
             + [f"excluded {r.row} ({r.model}, {r.gpus} GPUs, {r.config}): {r.note}" for r in excluded])
    return SuiteResult(NAME, labels, [(p.row.machine, p.row.model, p.row.gpus, p.row.global_batch) for p in priced],
                       np.array([p.predicted_s for p in priced]), np.array([p.measured_s for p in priced]),
                       notes=notes, machines=[p.row.machine for p in priced],
                       layouts=["TPxPPxDP" if p.row.layout == "megatron" else "4D" for p in priced],
                       gpus=[p.row.gpus for p in priced])


def price_frontier(checks=None) -> SuiteResult:
    """The ``frontier-public`` suite: the weak-scaling points of ``perfmodel.weak_scaling`` with a published
    throughput (the 32,768-GCD one taken from check-published's "SC24 Frontier 320B", the same problem) and
    check-published's Frontier study points."""
    from .published import check_all
    from .weak_scaling import PUBLISHED_EFFICIENCY, SERIES, predict
    cs = {c.point.name: c for c in (checks or check_all())}
    top = cs["SC24 Frontier 320B"]
    own = predict(series=tuple((g, m) for g, m in SERIES if g in PUBLISHED_EFFICIENCY and g != top.point.gpus))
    labels, pred, ratio, layouts, gpus = [], [], [], [], []
    for p in own:
        labels.append(f"AxoNN weak scaling {p.model} on {p.gcds} GCDs ({p.row.grid_str})")
        pred.append(p.row.time_s)
        ratio.append(p.tflops / p.published_tflops)
        layouts.append("4D")
        gpus.append(p.gcds)
    for c in [top] + [c for n, c in cs.items() if n.startswith("Frontier study")]:
        labels.append(f"{c.point.name} ({c.predicted.grid_str})")
        pred.append(c.predicted.time_s)
        ratio.append(c.ratio)
        layouts.append(c.predicted.layout)
        gpus.append(c.point.gpus)
    p = np.array(pred)
    return SuiteResult("frontier-public", labels, [(i,) for i in range(len(labels))], p, p * np.array(ratio),
                       machines=["frontier"] * len(labels), layouts=layouts, gpus=gpus)


def run_suites(names: tuple[str, ...] = SUITES, vtrain_path: str | Path | None = None) -> list[SuiteResult]:
    """Price the named suites and fill in their metrics."""
    bad = [n for n in names if n not in SUITES]
    if bad:
        raise PerfModelError(f"unknown suite {bad[0]!r}; known: {', '.join(SUITES)}")
    checks = None
    out = []
    for n in names:
        if n == "vtrain":
            res = price_vtrain(vtrain_path)
        elif n == "vtrain-multi":
            res = price_vtrain(vtrain_csv("multi"), name=n)
        elif n == "llama-public":
            res = price_llama()
        elif n == "frontier-public":
            if checks is None:
                from .published import check_all
                checks = check_all()
            res = price_frontier(checks)
        else:
            if checks is None:
                from .published import check_all
                checks = check_all()
            res = price_published(n == "korthikanti", checks)
        res.metrics = suite_metrics(res.predicted, res.measured, res.groups)
        out.append(res)
    return out


#: the suites whose residuals make a machine's band (``band.SUITE_SUFFIX``); vtrain-multi is the held-out test and
#: "published" repeats the Korthikanti points (its others are check-published's, stored by that command)
BAND_SUITES = ("vtrain", "korthikanti", "llama-public")
#: the machine of a suite whose rows do not name theirs
SUITE_MACHINE = {"vtrain": "dgx-a100"}


def suite_residuals(results: list[SuiteResult]) -> dict[str, list]:
    """Machine name → the ``band.Residual`` of every row of the ``BAND_SUITES`` among ``results`` priced on it
    (``problem`` = the suite's name, so that the rows of one suite are replaced together)."""
    from .band import Residual
    out: dict[str, list[Residual]] = {}
    for res in results:
        if res.name not in BAND_SUITES:
            continue
        machines = res.machines or [SUITE_MACHINE[res.name]] * len(res.labels)
        for lab, m, layout, gpus, p, t in zip(res.labels, machines, res.layouts, res.gpus, res.predicted,
                                              res.measured):
            out.setdefault(m, []).append(Residual(f"{res.name}: {lab}", layout, int(gpus), "", float(f"{p:.6g}"),
                                                  float(f"{t:.6g}"), problem=res.name))
    return out


WRITE_SUITES_COMMAND = "python experiments/perfmodel/write_suite_residuals.py"


def write_suite_residuals(results: list[SuiteResult]) -> list[Path]:
    """Store each machine's suite residuals as ``NAME.suite-residuals.json`` next to its shipped TOML; returns the
    files written."""
    from .band import suite_residuals_path, write_residuals
    return [write_residuals(suite_residuals_path(load_machine(m)), m, pts, WRITE_SUITES_COMMAND, one_line=True)
            for m, pts in suite_residuals(results).items()]


def summary_line(res: SuiteResult) -> str:
    """One line of a suite's metrics."""
    k = res.metrics
    line = (f"{res.name:12} n={k['n']:5d}  MAPE {k['mape']:5.1f}%  median {k['median_error']:5.1f}%  "
            f"within ±{WITHIN:.0%} {k['within_n']}/{k['n']} ({k['within']:.0%}; ratio {k['ratio_within_n']})  "
            f"measured/predicted {k['ratio_median']:.2f}")
    if k["groups"]:
        line += (f"  ρ {k['spearman']:.2f} over {k['groups'] - k['groups_tied']} groups"
                 + (f" (+{k['groups_tied']} all-tied)" if k["groups_tied"] else "")
                 + f"  regret {k['regret_mean']:.3f} / {k['regret_worst']:.2f}")
    if res.notes:     # a suite of named public rows (llama-public): each row, then those left out
        rows = [f"  {lab}: predicted {p:.4g} s, measured {m:.4g} s ({100 * (p - m) / m:+.1f}%)"
                for lab, p, m in zip(res.labels, res.predicted, res.measured)]
        line += "\n" + "\n".join(rows + [f"  {n}" for n in res.notes])
    return line


def write_scatter(res: SuiteResult, path: str | Path) -> bool:
    """Predicted vs measured seconds of a suite, log-log, with the y = x line and ±15% lines, as a PNG (Agg);
    False when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(res.predicted, res.measured, s=6 if res.predicted.size > 50 else 20, alpha=0.6)
    if res.predicted.size <= 20:
        for lab, p, m in zip(res.labels, res.predicted, res.measured):
            ax.annotate(lab, (p, m), fontsize=6)
    lo = float(min(res.predicted.min(), res.measured.min())) * 0.8
    hi = float(max(res.predicted.max(), res.measured.max())) * 1.25
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "k--", lw=0.8)
    for f in (1 - WITHIN, 1 + WITHIN):
        ax.plot(xs, xs * f, "k:", lw=0.5)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="predicted s/iteration",
           ylabel="measured s/iteration")
    k = res.metrics
    title = f"{res.name}: MAPE {k['mape']:.1f}%, {k['within']:.0%} within ±15%"
    if k["groups"]:
        title += f"\nρ {k['spearman']:.2f}, regret {k['regret_mean']:.3f} / {k['regret_worst']:.2f}"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


__all__ = ["SUITES", "WITHIN", "MIN_GROUP", "VTRAIN_VOCAB", "SuiteResult", "suite_metrics", "vtrain_rows",
           "vtrain_problem", "price_vtrain", "price_published", "price_llama", "run_suites", "BAND_SUITES",
           "suite_residuals", "write_suite_residuals", "summary_line", "write_scatter"]
