"""The per-step metrics record: one row per training step, the same fields for every driver.

    meter = StepMeter(grid, flops_per_step=cfg.flops_per_iteration(batch), tokens_per_step=batch * seq,
                      dtype="bf16")
    meter.begin(); train_step(...); row = meter.end(step, loss=loss)      # collective: every rank calls end()

Fields of a row (``event: "step"``; null where a figure does not exist on this run):

==================  ===========================================================================================
``step``            the step's index
``step_s``          wall seconds of the step, the slowest rank's (devices synchronised at both ends)
``tokens``          tokens trained in the step (the global batch)
``tokens_per_s``    ``tokens / step_s``
``flops``           the model FLOPs of the step as the driver counts them (``axgrid.spec``'s formula; with
                    recompute it counts the recomputed forward, as the AxoNN papers and ``perfmodel`` do)
``tflops``          achieved TFLOP/s per device: ``flops / step_s / world / 1e12``
``mfu``             ``tflops`` over the device's dense peak for the run's dtype (:mod:`.peaks`), or null
``peak_mem_bytes``  the largest peak over the ranks (:mod:`.memory`: allocator peak on a GPU, RSS on a CPU)
``comm_bytes``      ``{dim: bytes}`` this rank's ledger during the step (rank 0's in the log)
``comm_s``          ``{dim: seconds}`` from post to completion, when the ledger is timed (``record_timing`` or
                    ``trace``), else null
``comm_exposed_s``  ``{dim: seconds}`` blocked waiting for collectives (the part not hidden under compute), when
                    timed, else null
``energy_j``        the job's energy in the step: the sum over its readers (:mod:`.energy`), or null
``power_w``         ``energy_j / step_s``: the job's mean power
``tokens_per_j``    ``tokens / energy_j``
``energy_source``   what ``energy_j`` is, or why it is null
==================  ===========================================================================================

The per-step reduction (slowest time, largest peak, summed energy) is two small all-gathers through the grid's
communicator (over the tensor-parallel block, then over d), posted after the step's ledger figures are taken,
so they are not counted in ``comm_bytes``.
"""
from __future__ import annotations

import socket
import time
from typing import Any, Optional, Sequence

import torch

from ..device import host_read
from .energy import energy_readers, key_hash
from .memory import PeakMemory
from .peaks import resolve_peak

DTYPES = ("bf16", "fp16", "fp32")


class StepMeter:
    """Builds the per-step record on every rank (see the module docstring); rank 0 usually writes it.

    ``flops_per_step``: model FLOPs of one step (all ranks together; None for a model ``axgrid.spec`` has no
    formula for: ``tflops`` and ``mfu`` are then null); ``tokens_per_step``: tokens of the global
    batch; ``dtype``: the run's compute dtype, for the peak; ``peak_flops`` (FLOP/s per device) or
    ``peak_machine`` (a perfmodel machine file, e.g. a calibrated ``local-4`` on a CPU) override the device table.
    """

    def __init__(self, grid: Any, *, flops_per_step: Optional[float], tokens_per_step: int, dtype: str,
                 peak_flops: Optional[float] = None, peak_machine: Optional[str] = None) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
        if not ((flops_per_step is None or flops_per_step >= 0) and tokens_per_step > 0):
            raise ValueError(f"flops_per_step {flops_per_step} and tokens_per_step {tokens_per_step} must be "
                             f"non-negative (or None) and positive")
        self.grid, self.device, self.dev = grid, grid.device, grid.accelerator
        self.flops_per_step = None if flops_per_step is None else float(flops_per_step)
        self.tokens_per_step, self.dtype = int(tokens_per_step), dtype
        self.name = self.dev.name()
        self.peak = resolve_peak(self.name, dtype, is_cpu=not self.dev.is_gpu, peak_flops=peak_flops,
                                 machine=peak_machine)
        self.memory = PeakMemory(self.dev)
        self.energy_reader, self.readers = energy_readers(self._gather_keys(key_hash(self.dev.energy_key())),
                                                          grid.rank)
        self.energy = self.dev.energy()
        self.energy_source = self._energy_source()
        self._t0: Optional[float] = None

    def _gather_keys(self, key: int) -> list[tuple[int, int]]:
        """Every rank's ``(device key, rank)`` (two all-gathers, before the first step)."""
        v = torch.tensor([[key, self.grid.rank]], dtype=torch.int64, device=self.device)
        for dims in ("xyz", "d"):
            if self.grid.size(dims) > 1:
                v = self.grid.comm.all_gather(v, dims).reshape(-1, 2)
        flat = host_read(v)
        return [(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]

    def _energy_source(self) -> str:
        what = "GPU" if self.dev.is_gpu else "node"
        if not self.energy.available:
            return self.energy.source
        return (f"{self.energy.source}; {self.readers} reader(s), one per {what}, job total = their sum")

    @property
    def timed_comm(self) -> bool:
        """Whether the ledger records seconds (``RuntimeConfig.record_timing`` or ``trace``)."""
        return bool(self.grid.comm.record_timing or self.grid.comm.tracer is not None)

    def info(self) -> dict[str, Any]:
        """What the run's rows are measured against: host, device, peak, memory and energy sources."""
        return {"host": socket.gethostname(), "device": self.name, "device_type": self.device.type,
                "world": self.grid.world_size, "grid": str(self.grid.shape), "dtype": self.dtype,
                "flops_per_step": self.flops_per_step, "tokens_per_step": self.tokens_per_step,
                "peak_flops": self.peak.flops, "peak_source": self.peak.source,
                "peak_mem_source": self.memory.source, "energy_source": self.energy_source,
                "energy_readers": self.readers, "comm_timed": self.timed_comm}

    # -- one step ---------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Call right before the step: synchronises the device, resets the memory peak, reads the counters."""
        self.dev.synchronize()
        self.memory.reset()
        self._ledger0 = self.grid.ledger.snapshot()
        self._e0 = self.energy.read() if self.energy_reader else None
        self._t0 = time.perf_counter()

    def end(self, step: int, loss: Optional[float | torch.Tensor] = None, **extra: Any) -> dict[str, Any]:
        """Call right after the step, on every rank (collective): the step's row, the same figures on every rank
        but ``comm_*`` (each rank's own ledger). ``loss``: this rank's loss (the same over its tensor-parallel
        block), averaged over the data-parallel ranks in the same reduction; ``extra`` (lr, ...) is added as
        given."""
        if self._t0 is None:
            raise RuntimeError("StepMeter.end() without begin(): call begin() right before the step")
        self.dev.synchronize()
        dt = time.perf_counter() - self._t0
        self._t0 = None
        comm_bytes, comm_s, exposed = self._ledger_delta()
        peak = self.memory.read()
        e1 = self.energy.read() if self.energy_reader else None
        mine = (e1 - self._e0) if (e1 is not None and self._e0 is not None) else None
        step_s, peak_all, energy, counted, mean_loss = self._reduce(dt, peak, mine, loss)
        energy_j = energy if (self.energy.available and counted == self.readers) else None
        tflops = (self.flops_per_step / step_s / self.grid.world_size / 1e12
                  if step_s > 0 and self.flops_per_step is not None else None)
        row = {"event": "step", "step": int(step), "step_s": step_s, "tokens": self.tokens_per_step,
               "tokens_per_s": self.tokens_per_step / step_s if step_s > 0 else None,
               "flops": self.flops_per_step, "tflops": tflops,
               "mfu": tflops * 1e12 / self.peak.flops if (tflops is not None and self.peak.flops) else None,
               "peak_mem_bytes": int(peak_all), "comm_bytes": comm_bytes, "comm_s": comm_s,
               "comm_exposed_s": exposed, "energy_j": energy_j,
               "power_w": energy_j / step_s if (energy_j is not None and step_s > 0) else None,
               "tokens_per_j": self.tokens_per_step / energy_j if energy_j else None,
               "energy_source": self.energy_source}
        if loss is not None:
            row["loss"] = mean_loss
        row.update(extra)
        return row

    def _ledger_delta(self) -> tuple[dict[str, int], Optional[dict[str, float]], Optional[dict[str, float]]]:
        before, now = self._ledger0, self.grid.ledger.entries   # settles the step's event times (nothing waits now)
        nbytes: dict[str, int] = {}
        secs: dict[str, float] = {}
        wait: dict[str, float] = {}
        for key, e in now.items():
            b = before.get(key)
            if b is not None and b.calls > e.calls:       # the ledger was reset during the step
                b = None
            dim = key[0]
            nbytes[dim] = nbytes.get(dim, 0) + e.bytes - (b.bytes if b else 0)
            secs[dim] = secs.get(dim, 0.0) + e.seconds - (b.seconds if b else 0.0)
            wait[dim] = wait.get(dim, 0.0) + e.wait_seconds - (b.wait_seconds if b else 0.0)
        dims = sorted(d for d in nbytes if nbytes[d] or secs[d])
        if not self.timed_comm:
            return {d: nbytes[d] for d in dims}, None, None
        return {d: nbytes[d] for d in dims}, {d: secs[d] for d in dims}, {d: wait[d] for d in dims}

    def _reduce(self, dt: float, peak: int, energy: Optional[float],
                loss: Optional[float | torch.Tensor]) -> tuple[float, float, float, int, float]:
        """Over all ranks: (slowest step time, largest peak, summed energy, readers that had a reading, mean loss
        over d of the tensor-parallel blocks' first members)."""
        mean = host_read(loss.detach().reshape(())) if isinstance(loss, torch.Tensor) else loss
        v = torch.tensor([[dt, float(peak), energy or 0.0, 1.0 if energy is not None else 0.0,
                           float(mean) if mean is not None else 0.0]], dtype=torch.float64, device=self.device)
        for dims, pick_loss in (("xyz", lambda g: g[0, 4]), ("d", lambda g: g[:, 4].mean())):
            if self.grid.size(dims) > 1:
                g = self.grid.comm.all_gather(v, dims).reshape(-1, 5)
                v = torch.stack([g[:, 0].max(), g[:, 1].max(), g[:, 2].sum(), g[:, 3].sum(),
                                 pick_loss(g)]).reshape(1, 5)
        out = host_read(v.reshape(5))
        return out[0], out[1], out[2], int(round(out[3])), out[4]

    def close(self) -> None:
        self.energy.close()


def summarize(rows: Sequence[dict[str, Any]], skip: int = 1) -> dict[str, Any]:
    """The run's figures from its step rows, the first ``skip`` left out of the means (warm-up) when enough rows:
    mean ``step_s``; ``tokens_per_s``, ``tflops``, ``mfu`` and ``power_w`` over the timed steps together; the
    largest ``peak_mem_bytes``; ``energy_j`` and ``tokens_per_j`` over the timed steps (null if any is null);
    ``comm_bytes`` of the last step; mean ``comm_s`` / ``comm_exposed_s`` per dimension."""
    if not rows:
        return {"steps": 0, "timed_steps": 0}
    timed = list(rows[skip:]) if len(rows) > skip else list(rows)
    secs = sum(r["step_s"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    step_s = secs / len(timed)
    out: dict[str, Any] = {"steps": len(rows), "timed_steps": len(timed), "step_s": step_s,
                           "tokens_per_s": tokens / secs if secs > 0 else None}
    for key in ("tflops", "mfu"):        # a mean of rates weighted by time: total work over total time
        vals = [r[key] for r in timed]
        out[key] = (sum(v * r["step_s"] for v, r in zip(vals, timed)) / secs
                    if secs > 0 and all(v is not None for v in vals) else None)
    out["peak_mem_bytes"] = max(r["peak_mem_bytes"] for r in rows)
    energies = [r["energy_j"] for r in timed]
    energy = sum(energies) if all(e is not None for e in energies) else None
    out.update(energy_j=energy, power_w=energy / secs if energy is not None and secs > 0 else None,
               tokens_per_j=tokens / energy if energy else None, energy_source=rows[-1]["energy_source"],
               comm_bytes=rows[-1]["comm_bytes"])
    for key in ("comm_s", "comm_exposed_s"):
        per = [r[key] for r in timed]
        out[key] = None if any(p is None for p in per) else \
            {d: sum(p.get(d, 0.0) for p in per) / len(per) for d in sorted({d for p in per for d in p})}
    return out
