"""The model's error band on a machine: how far its predicted times have been from measured ones there.

Residuals. For every point validated on a machine, e = ln(measured time / predicted time) (> 0: the model was
optimistic). For the shipped machines they are the ``check-published`` points on that machine (a published time
per iteration, or published TFLOP/s per GPU turned into a time with the FLOP count of the prediction, so
e = ln(predicted / published TFLOP/s)); for a calibrated local machine they are the configurations
``validate`` measured there. They are stored next to the machine file, as ``NAME.residuals.json`` beside
``NAME.toml`` (the shipped ones in ``axgrid/perfmodel/machines/``); refresh them with
``python -m axgrid.perfmodel check-published --write-residuals`` (every shipped machine with published points) or
``python -m axgrid.perfmodel validate ... --measured FILE --write-residuals`` (the machine validated; replaces that
problem's earlier points, keeps the other problems').

Suite residuals. Where a machine has a validation suite (``validate-public``: vTrain's single-node runs and the
Korthikanti points on ``dgx-a100``, the ``llama-public`` rows on ``dgx-a100`` and ``dgx-h100``), its residuals are
stored as ``NAME.suite-residuals.json`` beside ``NAME.toml`` (``suites.write_suite_residuals``, run by
``python experiments/perfmodel/write_suite_residuals.py``; vTrain's multi-node runs stay out: they are the held-out
test) and the band comes from them, not from the check-published points.

Band. A predicted time t on a machine with residuals e_1 … e_n gets

    time_low = t · exp(min(0, q_lo)),   time_high = t · exp(max(0, q_hi))

with q_lo, q_hi the smallest and largest error (n < ``QUANTILE_MIN``) or the (1 − ``BAND_LEVEL``)/2 and
(1 + ``BAND_LEVEL``)/2 empirical quantiles of the errors (n ≥ ``QUANTILE_MIN``: a 90% range that a few outliers of a
large suite do not stretch), widened to contain 1 so that time_low ≤ t ≤ time_high always. It is an empirical range,
not a confidence interval: if a new configuration's error were drawn like the n seen (exchangeable), it would fall
inside [min e, max e] with probability (n − 1)/(n + 1): 1/3 for n = 2, 7/9 for n = 8, and inside the quantile range
with about ``BAND_LEVEL``. With n = 1 the band is that one error, on one side of t only;
with n = 0 (a machine never validated) the band is that of every shipped machine's published-point residuals
pooled (not the local machines' ``validate`` points: CPU ranks say nothing about a GPU cluster), and every row
says the machine was never validated.

Range. A machine's validated range is up to the largest GPU count among its points, in the layout families
(4D, TPxPPxDP) among them. A row beyond it says so (``out_of_range``); its band is still the machine's.

Within model error of the best: a row whose band overlaps the best row's band (time_low ≤ best's time_high):
the model cannot tell it from the best.

Which rows it can tell apart (``slower_confidence``, ``separation``). Row i (predicted t_i ≥ t_1) is truly slower
than row 1 when t_i·exp(e_i) > t_1·exp(e_1), i.e. e_1 − e_i < ln(t_i / t_1). Drawing the two rows' errors as two
different residuals of the machine (every ordered pair a ≠ b of the n, each equally likely), the confidence that
row i is slower is the share of pairs with e_a − e_b < ln(t_i / t_1) (a tie counts half), times m/(m + 1) with
m = ⌊n/2⌋ the number of independent differences the n residuals hold (as a new error falls beyond the m seen with
probability 1/(m + 1)): with fewer than 18 residuals no row reaches 90%. Independent draws are the cautious reading: the errors of two configurations of one problem share most of their causes, which cancel in the
difference. The confidence grows with t_i / t_1, so the rows split into a head the model cannot tell from row 1 at
``SEPARATION_LEVEL`` and a tail it can; a machine never validated (pooled band) or validated at one point gets no
confidence, and the statement says why.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from .errors import PerfModelError
from .machines import MACHINE_DIR, Machine
from .row import Row

SUFFIX = ".residuals.json"
#: a validation suite's residuals for the machine (preferred over SUFFIX's check-published points)
SUITE_SUFFIX = ".suite-residuals.json"
#: the band's coverage when it is made of quantiles
BAND_LEVEL = 0.90
#: from this many residuals on, the band uses the quantiles instead of the extremes
QUANTILE_MIN = 20
#: the confidence at which ``separation`` calls a row slower than row 1
SEPARATION_LEVEL = 0.90


@dataclass(frozen=True)
class Residual:
    """One validated point: predicted and measured seconds of one configuration on the machine."""

    name: str           # the published point's name, or the validated problem + grid
    layout: str         # "4D" or "TPxPPxDP"
    gpus: int
    config: str
    predicted_s: float
    measured_s: float
    problem: str = ""   # validate: the problem the point belongs to (its points are replaced together)

    @property
    def error(self) -> float:
        """ln(measured / predicted)."""
        return math.log(self.measured_s / self.predicted_s)


@dataclass(frozen=True)
class Band:
    """The residuals of one machine (or, ``own`` False, of all machines pooled) and what they cover."""

    machine: str
    residuals: tuple[Residual, ...]
    own: bool               # measured on this machine
    source: str             # the file(s) read

    @property
    def errors(self) -> list[float]:
        """The residuals' ln(measured / predicted), sorted."""
        return sorted(r.error for r in self.residuals)

    def _edge(self, side: int) -> float:
        e = self.errors
        if not e:
            return 0.0
        if len(e) < QUANTILE_MIN:
            return e[0] if side < 0 else e[-1]
        q = (1 - BAND_LEVEL) / 2 if side < 0 else (1 + BAND_LEVEL) / 2
        return float(np.quantile(np.array(e), q))

    @property
    def lo(self) -> float:
        """exp(min(0, q_lo)): time_low / time (module docstring)."""
        return math.exp(min(0.0, self._edge(-1)))

    @property
    def hi(self) -> float:
        """exp(max(0, q_hi)): time_high / time."""
        return math.exp(max(0.0, self._edge(+1)))

    @property
    def gpus_max(self) -> int:
        return max((r.gpus for r in self.residuals), default=0) if self.own else 0

    @property
    def layouts(self) -> frozenset[str]:
        return frozenset(r.layout for r in self.residuals) if self.own else frozenset()

    def out_of_range(self, gpus: int, layout: str) -> str:
        """Why a prediction for ``gpus`` GPUs in ``layout`` lies outside what was validated here ("" if inside)."""
        if not self.own:
            return f"never validated on {self.machine} (band: all machines' {len(self.residuals)} residuals pooled)"
        why = []
        if gpus > self.gpus_max:
            why.append(f"{gpus} GPUs > {self.gpus_max}, the largest validated on {self.machine}")
        if layout not in self.layouts:
            why.append(f"{layout} never validated on {self.machine}")
        return "; ".join(why)

    def describe(self) -> str:
        """One line: what the band is made of."""
        n = len(self.residuals)
        where = self.machine if self.own else f"all machines (none on {self.machine})"
        what = (f"the {BAND_LEVEL:.0%} range" if n >= QUANTILE_MIN else "the range")
        return (f"model error band on {where}: ×{self.lo:.2f}–×{self.hi:.2f} of the predicted time, {what} of "
                f"measured/predicted over {n} validated point{'s' * (n != 1)} ({self.source})")


def suite_residuals_path(machine: Machine) -> Path | None:
    """``NAME.suite-residuals.json`` next to the machine's TOML (None for a machine built in code)."""
    return Path(machine.source).with_suffix(SUITE_SUFFIX) if machine.source else None


def residuals_path(machine: Machine) -> Path | None:
    """``NAME.residuals.json`` next to the machine's TOML (None for a machine built in code)."""
    return Path(machine.source).with_suffix(SUFFIX) if machine.source else None


def read_residuals(path: Path) -> list[Residual]:
    """The residuals stored in ``path`` ([] when absent); a malformed file is a one-line PerfModelError."""
    if not path.is_file():
        return []
    try:
        doc = json.loads(path.read_text())
        keys = {f.name for f in fields(Residual)}
        return [Residual(**{k: v for k, v in r.items() if k in keys}) for r in doc["points"]]
    except (ValueError, TypeError, KeyError) as e:
        raise PerfModelError(f"{path}: not a residuals file ({e!r}); rewrite it with `python -m axgrid.perfmodel "
                             f"check-published --write-residuals` or `validate ... --write-residuals`") from None


def write_residuals(path: Path, machine: str, points: list[Residual], written_by: str,
                    one_line: bool = False) -> Path:
    """Write ``points`` as ``path`` (atomically: temp file + rename); ``one_line``: each point on one line (a
    suite's thousand points stay a small file)."""
    doc = {"machine": machine, "written_by": written_by,
           "definition": "error = ln(measured_s / predicted_s); see axgrid.perfmodel.band",
           "points": [{**asdict(r), "error": round(r.error, 6)} for r in points]}   # error: derived, for readers
    if one_line:
        head = json.dumps({k: v for k, v in doc.items() if k != "points"}, indent=1)[:-2]
        text = head + ',\n "points": [\n' + ",\n".join(json.dumps(p) for p in doc["points"]) + "\n ]\n}"
    else:
        text = json.dumps(doc, indent=1)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    return path


def band_for(machine: Machine) -> Band:
    """The machine's band: its validation suites' residuals, else its own stored (check-published or validate)
    residuals, else every shipped machine's published-point residuals pooled (those without a ``problem``:
    ``validate`` points stay their machine's own)."""
    for path in (suite_residuals_path(machine), residuals_path(machine)):
        own = read_residuals(path) if path else []
        if own:
            return Band(machine.name, tuple(own), True, path.name)
    files = sorted(MACHINE_DIR.glob("*" + SUFFIX))
    pooled = [r for f in files for r in read_residuals(f) if not r.problem]
    return Band(machine.name, tuple(pooled), False, f"{len(files)} files in axgrid/perfmodel/machines")


def with_band(rows: list[Row], band: Band, best_high: float, gpus: int) -> list[Row]:
    """``rows`` with time_low / time_high, within_error (band overlaps the best row's, whose time_high is
    ``best_high``) and out_of_range filled; infeasible rows keep infinite times and are never within error."""
    out = []
    for r in rows:
        if not r.feasible:
            out.append(replace(r, time_low=math.inf, time_high=math.inf, within_error=False,
                               out_of_range=band.out_of_range(gpus, r.layout)))
            continue
        lo, hi = r.time_s * band.lo, r.time_s * band.hi
        out.append(replace(r, time_low=lo, time_high=hi, within_error=lo <= best_high,
                           out_of_range=band.out_of_range(gpus, r.layout)))
    return out


def banded(row: Row, machine: Machine, gpus: int) -> Row:
    """One priced configuration on its own (``rank --grid`` / ``--tp``) with the machine's band."""
    band = band_for(machine)
    return with_band([row], band, row.time_s * band.hi, gpus)[0]


def slower_confidence(errors, ratio) -> np.ndarray:
    """For each predicted ratio t_i / t_1 ≥ 1 in ``ratio``: the share of ordered pairs (a, b), a ≠ b, of ``errors``
    (ln(measured / predicted)) with e_a − e_b < ln(ratio), a tie counted half, times m/(m + 1), m = ⌊n/2⌋: the
    confidence that a row predicted ``ratio`` times slower than row 1 is truly slower (module docstring). Needs ≥ 2
    errors."""
    e = np.sort(np.asarray(errors, float))
    n = e.size
    if n < 2:
        raise PerfModelError(f"a confidence needs at least 2 residuals, got {n}")
    d = np.log(np.asarray(ratio, float))
    out = np.empty(d.shape)
    for i, di in np.ndenumerate(d):
        # pairs with e_b > e_a − d, and ties e_b == e_a − d, counted over every a (then less the pairs a == b)
        greater = n - np.searchsorted(e, e - di, side="right")
        ties = np.searchsorted(e, e - di, side="right") - np.searchsorted(e, e - di, side="left")
        self_pairs = n if di > 0 else (n / 2 if di == 0 else 0)   # a == b: e_a − e_a = 0 < d when d > 0
        out[i] = (greater.sum() + ties.sum() / 2 - self_pairs) / (n * (n - 1))
    m = n // 2
    return out * m / (m + 1)


def separation(times: list[float], band: Band, level: float = SEPARATION_LEVEL) -> str:
    """Which of the rows (predicted ``times``, best first, numbered from 1) the model can tell from row 1 at
    ``level`` confidence with ``band``'s residuals (module docstring), as one sentence."""
    n = len(times)
    if n < 2:
        return ""
    if not band.own:
        return (f"The model was never validated on {band.machine}: it cannot say with what confidence any row is "
                f"slower than row 1 (validate it there: docs/perfmodel.md).")
    if len(band.residuals) < 2:
        return (f"One validated point on {band.machine}: too few to state a confidence that any row is slower than "
                f"row 1.")
    conf = slower_confidence(band.errors, [t / times[0] for t in times[1:]])
    k = 1 + int(np.sum(conf < level))          # conf grows with the row: rows 1..k are the head
    src = f"{len(band.residuals)} residuals on {band.machine} ({band.source}), errors drawn independently"
    if k == n:
        return (f"Rows 1–{n} are indistinguishable: the model cannot say that any is slower than row 1 with "
                f"{level:.0%} confidence ({src}).")
    first = f"row {k + 1} is slower than row 1 with {conf[k - 1]:.0%} confidence"
    rest = n - k - 1                           # rows after row k + 1
    later = ("" if rest == 0 else f", row {n} with at least that" if rest == 1
             else f", rows {k + 2}–{n} with at least that")
    if k == 1:
        return f"R{first[1:]}{later} ({src})."
    return f"Rows 1–{k} are indistinguishable at {level:.0%}; {first}{later} ({src})."
