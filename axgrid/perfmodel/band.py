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

Band. A predicted time t on a machine with residuals e_1 … e_n gets

    time_low = t · exp(min(0, min e_i)),   time_high = t · exp(max(0, max e_i))

the range of the measured/predicted ratios seen on that machine, widened to contain 1 so that
time_low ≤ t ≤ time_high always. It is an empirical range, not a confidence interval: if a new configuration's
error were drawn like the n seen (exchangeable), it would fall inside [min e, max e] with probability
(n − 1)/(n + 1): 1/3 for n = 2, 7/9 for n = 8. With n = 1 the band is that one error, on one side of t only;
with n = 0 (a machine never validated) the band is that of every shipped machine's published-point residuals
pooled (not the local machines' ``validate`` points: CPU ranks say nothing about a GPU cluster), and every row
says the machine was never validated.

Range. A machine's validated range is up to the largest GPU count among its points, in the layout families
(4D, TPxPPxDP) among them. A row beyond it says so (``out_of_range``); its band is still the machine's.

Within model error of the best: a row whose band overlaps the best row's band (time_low ≤ best's time_high):
the model cannot tell it from the best.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from .errors import PerfModelError
from .machines import MACHINE_DIR, Machine
from .row import Row

SUFFIX = ".residuals.json"


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
    def lo(self) -> float:
        """exp(min(0, min e)): time_low / time."""
        return math.exp(min([0.0] + [r.error for r in self.residuals]))

    @property
    def hi(self) -> float:
        """exp(max(0, max e)): time_high / time."""
        return math.exp(max([0.0] + [r.error for r in self.residuals]))

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
        return (f"model error band on {where}: ×{self.lo:.2f}–×{self.hi:.2f} of the predicted time, the range of "
                f"measured/predicted over {n} validated point{'s' * (n != 1)} ({self.source})")


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


def write_residuals(path: Path, machine: str, points: list[Residual], written_by: str) -> Path:
    """Write ``points`` as ``path`` (atomically: temp file + rename)."""
    doc = {"machine": machine, "written_by": written_by,
           "definition": "error = ln(measured_s / predicted_s); see axgrid.perfmodel.band",
           "points": [{**asdict(r), "error": round(r.error, 6)} for r in points]}   # error: derived, for readers
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def band_for(machine: Machine) -> Band:
    """The machine's band: its own stored residuals, else every shipped machine's published-point residuals
    pooled (those without a ``problem``: ``validate`` points stay their machine's own)."""
    path = residuals_path(machine)
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
