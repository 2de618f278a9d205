"""``perfmodel rank --verify K``: dry-run the top K 4D rows of a ranking (``python -m axgrid.dryrun``, one process
per row: the dry run registers a fake GPU device that cannot be unregistered, and perfmodel stays torch-free) and
mark the rows whose measured peak does not fit the machine's memory, or whose collectives' bytes differ from the
prediction.

A dry run needs a named model (the runtime builds the same GPT) and takes about a second per layer and step on a
CPU core; each row's figures come from the dry run's ``--json`` document.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from axgrid.spec import NAMED_SIZES

from .errors import PerfModelError
from .row import Row
from .problem import Problem
from .units import memory_unit


@dataclass(frozen=True)
class Verified:
    """One row's dry run: its measured peak (bytes, the largest over the ranks run), whether it fits the machine's
    memory, whether every collective's bytes and calls equal the prediction, and the dry run's differences."""

    row: Row
    peak: int
    fits: bool
    bytes_equal: bool
    disagreements: list[str]
    seconds: float

    def mark(self) -> str:
        marks = ([] if self.fits else ["DOES NOT FIT"]) + ([] if self.bytes_equal else ["BYTES DIFFER"])
        return ", ".join(marks) or "ok"


def dryrun_command(prob: Problem, machine: str, row: Row, json_path: str) -> list[str]:
    """The ``python -m axgrid.dryrun`` command of one 4D row of ``prob``."""
    spec = prob.model
    named = NAMED_SIZES.get(spec.name)
    if named != spec:
        raise PerfModelError(f"--verify dry-runs a named model (the runtime builds it): {spec.name} with these sizes "
                             f"is not one; use --model NAME without --layers/--hidden/--heads/--seq/--vocab")
    opt = prob.options
    if opt.grad_reduce != "fp32" or opt.order != "xyzd":
        raise PerfModelError("--verify runs the runtime's defaults: leave --grad-reduce fp32 and --order xyzd")
    return [sys.executable, "-m", "axgrid.dryrun", "--model", spec.name, "--grid", row.grid_str, "--machine", machine,
            "--batch", str(prob.batch), "--microbatches", str(row.microbatches), "--dtype", prob.dtype,
            "--recompute" if opt.recompute else "--no-recompute", "--overlap", opt.overlap_spec(),
            "--zero", str(row.zero), "--json", json_path]


def verify_rows(prob: Problem, machine: str, rows: list[Row], timeout_s: float = 3600.0,
                echo=print) -> list[Verified]:
    """Dry-run each of ``rows`` (4D rows of ``prob`` on ``machine``, a name or .toml path) and read its figures."""
    out = []
    for i, row in enumerate(rows, 1):
        if row.layout != "4D":
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "dryrun.json")
            cmd = dryrun_command(prob, machine, row, path)
            echo(f"verify {i}/{len(rows)}: {' '.join(cmd[1:])}")
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise PerfModelError(f"--verify: the dry run of {row.grid_str} took over {timeout_s:.0f} s") from None
            if not os.path.exists(path):
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise PerfModelError(f"--verify: the dry run of {row.grid_str} failed (exit {done.returncode}): "
                                     f"{tail[0]}")
            with open(path) as f:
                doc = json.load(f)
        ranks = doc["ranks"]
        bytes_equal = all(c["bytes"] == c["predicted_bytes"] and c["calls"] == c["predicted_calls"]
                          for r in ranks for c in r["comm"])
        out.append(Verified(row, max(r["peak_bytes"] for r in ranks), doc["fits"], bytes_equal,
                            doc["disagreements"], sum(r["seconds"] for r in ranks)))
    return out


def verify_table(verified: list[Verified], memory_bytes: int) -> str:
    """The verified rows: predicted and measured peak per GPU, the machine's memory, the bytes' verdict; memory in
    the unit ``units.memory_unit`` picks for the peaks shown, as the ranking table's memory column does."""
    unit, scale = memory_unit([v.row.memory_bytes for v in verified] + [v.peak for v in verified])
    lines = [f"{'#':>3}  {'grid':<18}{'predicted':>14}{'dry run':>14}{'memory':>14}  bytes   verdict"]
    for i, v in enumerate(verified, 1):
        r = v.row
        name = r.grid_str + (f" zero{r.zero}" if r.zero else "")
        lines.append(f"{i:>3}  {name:<18}{r.memory_bytes / scale:>10.2f} {unit}{v.peak / scale:>10.2f} {unit}"
                     f"{memory_bytes / scale:>10.1f} {unit}  {'equal' if v.bytes_equal else 'DIFFER':<6}  {v.mark()}")
    return "\n".join(lines)
