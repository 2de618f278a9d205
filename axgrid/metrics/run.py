"""What a training driver holds: the step meter and the sinks together, and their command-line options.

    metrics = Metrics(grid, flops_per_step=F, tokens_per_step=T, dtype="bf16", jsonl="run.jsonl",
                      tensorboard="tb/", progress=steps, config={"model": "gpt-tiny", "batch": 8})
    for step in range(steps):
        metrics.begin(); out = train_step(...); metrics.end(step, loss=float(out.loss))
    summary = metrics.close(final_loss=...)             # the "summary" row, on every rank

Rows: a ``config`` row (the driver's ``config`` plus :meth:`StepMeter.info`), one ``step`` row per step
(:mod:`.record`), an ``eval`` row per evaluation (:meth:`Metrics.evaluation`: ``valid_loss``, ``valid_ppl``), a
``summary`` row (:func:`.record.summarize`, the last evaluation, plus what ``close`` is given). Drivers add the
options with :func:`add_arguments` and build with :meth:`Metrics.from_args`.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional

from ..perfmodel.errors import MachineFileError
from .record import StepMeter, summarize
from .sinks import MetricsLog


class Metrics:
    """A :class:`StepMeter` whose rows go to a :class:`MetricsLog` (rank 0) and are kept for the summary."""

    def __init__(self, grid: Any, *, flops_per_step: float, tokens_per_step: int, dtype: str,
                 config: Optional[dict[str, Any]] = None, jsonl: Optional[str] = None,
                 tensorboard: Optional[str] = None, progress: Optional[int] = None, initial: int = 0,
                 append: bool = False, peak_flops: Optional[float] = None, peak_machine: Optional[str] = None,
                 timing_skip: int = 1) -> None:
        self.meter = StepMeter(grid, flops_per_step=flops_per_step, tokens_per_step=tokens_per_step, dtype=dtype,
                               peak_flops=peak_flops, peak_machine=peak_machine)
        self.log = MetricsLog(grid.rank, jsonl=jsonl, tensorboard=tensorboard, progress=progress,
                              initial=initial, append=append)
        self.timing_skip = timing_skip
        self.rows: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.log.write({"event": "config", **(config or {}), **self.meter.info()})

    @classmethod
    def from_args(cls, grid: Any, args: argparse.Namespace, **kwargs: Any) -> "Metrics":
        """Built from the options of :func:`add_arguments` (``kwargs``: the rest of ``__init__``'s). A bad option
        ends the run with a one-line message, the same on every rank, before the first step."""
        if args.peak_tflops is not None and not args.peak_tflops > 0:
            raise SystemExit(f"--peak-tflops {args.peak_tflops}: the device's dense peak must be > 0, e.g. 989")
        if args.timing_skip < 0:
            raise SystemExit(f"--timing-skip {args.timing_skip}: warm-up steps must be >= 0")
        try:
            return cls(grid, jsonl=args.log, tensorboard=args.tensorboard,
                       peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
                       peak_machine=args.peak_machine, timing_skip=args.timing_skip, **kwargs)
        except MachineFileError as e:
            raise SystemExit(f"--peak-machine {args.peak_machine}: {e}") from None

    def begin(self) -> None:
        self.meter.begin()

    def end(self, step: int, **extra: Any) -> dict[str, Any]:
        """The step's row (collective: every rank calls it), written by rank 0."""
        row = self.meter.end(step, **extra)
        self.rows.append(row)
        self.log.write(row)
        return row

    def evaluation(self, step: int, **values: Any) -> dict[str, Any]:
        """An ``eval`` row after ``step`` steps (``valid_loss``, ``valid_ppl``, ...), written by rank 0."""
        row = {"event": "eval", "step": step, **values}
        self.evals.append(row)
        self.log.write(row)
        return row

    def summary(self) -> dict[str, Any]:
        last = {k: v for k, v in self.evals[-1].items() if k not in ("event", "step")} if self.evals else {}
        return {"event": "summary", **summarize(self.rows, self.timing_skip), **last}

    def close(self, **extra: Any) -> dict[str, Any]:
        """Write the summary row (with ``extra``), close the sinks; returns the summary on every rank."""
        out = {**self.summary(), **extra}
        self.log.write(out)
        self.log.close()
        self.meter.close()
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The metrics options every driver shares."""
    g = parser.add_argument_group("metrics")
    g.add_argument("--log", default=None, help="JSON-lines file of config, step and summary rows (rank 0)")
    g.add_argument("--tensorboard", default=None, metavar="DIR", help="also write TensorBoard scalars to DIR")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")
    g.add_argument("--timing-skip", type=int, default=1, help="warm-up steps left out of the summary's means")
    g.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense peak TFLOP/s for MFU (default: the device table; none on a CPU)")
    g.add_argument("--peak-machine", default=None, metavar="NAME|FILE",
                   help="take the peak from a perfmodel machine file, e.g. a calibrated local-4 on a CPU")
    g.add_argument("--comm-timing", action="store_true",
                   help="time every collective (comm_s, comm_exposed_s per dimension; synchronises the GPU)")
