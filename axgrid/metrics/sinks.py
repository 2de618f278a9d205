"""Where the metrics rows go: a JSON-lines file always, TensorBoard when asked, a progress bar on a terminal.

Rows are dicts with an ``event`` ("config", "step", "summary"). Only rank 0 writes (:class:`MetricsLog` is
a no-op elsewhere). TensorBoard is written with ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard``
package, in the ``metrics`` extra): each numeric field of a step row is a scalar under its group
(``throughput/tokens_per_s``, ``memory/peak_mem_bytes``, ``comm/exposed_s/y``, ``energy/power_w``,
``train/loss``...), each field of an eval row under ``valid/`` (``valid/loss``, ``valid/ppl``), the config row is
a text summary. The bar is tqdm's, on stderr, shown only when stderr is a terminal and not switched off; without a
terminal (a batch job's log) :class:`ProgressLines` prints a line on stdout every N steps instead, so a Slurm
``.out`` shows how the run goes.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any, Optional, TextIO

GROUPS = {"step_s": "time", "tokens_per_s": "throughput", "tflops": "throughput", "mfu": "throughput",
          "peak_mem_bytes": "memory", "energy_j": "energy", "power_w": "energy", "tokens_per_j": "energy"}
NOT_SCALARS = ("event", "step", "tokens", "flops", "energy_source")


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of a step row: ``{tag: value}`` (null fields left out)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in NOT_SCALARS or value is None:
            continue
        if isinstance(value, dict):                       # comm_bytes / comm_s / comm_exposed_s per dimension
            sub = key.removeprefix("comm_")
            out.update({f"comm/{sub}/{d}": float(v) for d, v in value.items() if isinstance(v, (int, float))})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{GROUPS.get(key, 'train')}/{key}"] = float(value)
    return out


class ProgressLines:
    """A run's progress as plain lines on ``out`` (default: stdout), for a log without a terminal: after every
    ``every``-th step and the last one, ``step 20/100: loss 2.4513, 3185 tokens/s, 0.322 s/step, 0:00:26 left``.
    The time left is the mean step time of this process's steps so far (the first left out once there are more)
    times the steps still to run."""

    def __init__(self, total: int, every: int, out: Optional[TextIO] = None) -> None:
        self.total, self.every, self.out = total, every, out
        self.times: list[float] = []

    def step(self, row: dict[str, Any]) -> Optional[str]:
        """Note a step row; the line when one is due (also printed), else None."""
        if row.get("step_s") is not None:
            self.times.append(float(row["step_s"]))
        done = int(row["step"]) + 1
        if done % self.every and done != self.total:
            return None
        parts = [f"loss {row['loss']:.4f}"] if row.get("loss") is not None else []
        if row.get("tokens_per_s") is not None:
            parts.append(f"{row['tokens_per_s']:.0f} tokens/s")
        recent = self.times[1:] if len(self.times) > 1 else self.times
        if recent:
            mean = sum(recent) / len(recent)
            left = round(mean * max(0, self.total - done))
            parts += [f"{mean:.3f} s/step", f"{left // 3600}:{left // 60 % 60:02d}:{left % 60:02d} left"]
        line = f"step {done}/{self.total}: " + ", ".join(parts)
        print(line, file=self.out or sys.stdout, flush=True)
        return line


class MetricsLog:
    """Rank 0's sinks. ``jsonl``: path of the JSON-lines file (appended to with ``append``); ``tensorboard``:
    a log directory; ``progress``: total steps for the bar on a terminal, or for :class:`ProgressLines` every
    ``progress_every`` steps without one (None: neither), ``initial`` its start."""

    def __init__(self, rank: int, *, jsonl: Optional[str] = None, tensorboard: Optional[str] = None,
                 progress: Optional[int] = None, initial: int = 0, append: bool = False,
                 progress_every: int = 10) -> None:
        if tensorboard and importlib.util.find_spec("tensorboard") is None:     # on every rank, before any row
            raise SystemExit(f"--tensorboard {tensorboard}: the tensorboard package is not installed; "
                             f"pip install 'axgrid[metrics]' (or tensorboard), or leave --tensorboard out")
        self.rank0 = rank == 0
        self._file = open(jsonl, "a" if append else "w") if (self.rank0 and jsonl) else None
        self._tb = None
        if self.rank0 and tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self._tb = SummaryWriter(tensorboard)
        self._bar = None
        self._lines: Optional[ProgressLines] = None
        if self.rank0 and progress is not None and sys.stderr.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=progress, initial=initial, file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
        elif self.rank0 and progress is not None:
            self._lines = ProgressLines(progress, progress_every)

    def write(self, row: dict[str, Any]) -> None:
        if not self.rank0:
            return
        if self._file is not None:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        event = row.get("event")
        if self._tb is not None:
            if event == "step":
                for tag, value in scalars(row).items():
                    self._tb.add_scalar(tag, value, int(row["step"]))
            elif event == "eval":
                for key, value in row.items():
                    if key not in NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                        self._tb.add_scalar(f"valid/{key.removeprefix('valid_')}", float(value), int(row["step"]))
            elif event == "config":
                self._tb.add_text("config", "\n".join(f"    {k}: {v}" for k, v in row.items()), 0)
            self._tb.flush()
        if self._lines is not None and event == "step":
            self._lines.step(row)
        if self._bar is not None and event == "step":
            post = {k: f"{row[k]:.4g}" for k in ("loss", "tokens_per_s", "mfu") if row.get(k) is not None}
            self._bar.set_postfix(post, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        for sink in (self._bar, self._tb, self._file):
            if sink is not None:
                sink.close()
        self._bar = self._tb = self._file = None
