"""Where the metrics rows go: a JSON-lines file always, TensorBoard when asked, a progress bar on a terminal.

Rows are dicts with an ``event`` ("config", "step", "summary"). Only rank 0 writes (:class:`MetricsLog` is
a no-op elsewhere). TensorBoard is written with ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard``
package, in the ``metrics`` extra): each numeric field of a step row is a scalar under its group
(``throughput/tokens_per_s``, ``memory/peak_mem_bytes``, ``comm/exposed_s/y``, ``energy/power_w``,
``train/loss``...), each field of an eval row under ``valid/`` (``valid/loss``, ``valid/ppl``), the config row is
a text summary. The bar is tqdm's, on stderr, shown only when stderr is a
terminal (never in a batch job's log) and not switched off.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any, Optional

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


class MetricsLog:
    """Rank 0's sinks. ``jsonl``: path of the JSON-lines file (appended to with ``append``); ``tensorboard``:
    a log directory; ``progress``: total steps for the bar (None: no bar), ``initial`` its start."""

    def __init__(self, rank: int, *, jsonl: Optional[str] = None, tensorboard: Optional[str] = None,
                 progress: Optional[int] = None, initial: int = 0, append: bool = False) -> None:
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
        if self.rank0 and progress is not None and sys.stderr.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=progress, initial=initial, file=sys.stderr, dynamic_ncols=True, mininterval=1.0)

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
        if self._bar is not None and event == "step":
            post = {k: f"{row[k]:.4g}" for k in ("loss", "tokens_per_s", "mfu") if row.get(k) is not None}
            self._bar.set_postfix(post, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        for sink in (self._bar, self._tb, self._file):
            if sink is not None:
                sink.close()
        self._bar = self._tb = self._file = None
