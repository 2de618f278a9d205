"""Run a function on N real gloo ranks, fast: a pool of rank processes started once from a forkserver that
has torch preloaded, reused across calls (tests, benchmarks). Each rank sees the same environment contract
as under ``axgrid launch`` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and has the default
process group initialised with a timeout, so a lost rank fails the call instead of hanging it.

    with RankPool(8) as pool:
        results = pool.run(fn, arg)        # fn(arg) on every rank; a list of 8 results

``fn`` must be importable (module level). If any rank raises or the call outlives its deadline, the pool is
torn down and ``RankFailure`` carries every rank's traceback; the next ``run`` starts a fresh pool.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Callable, Optional, Sequence

from ..launch.env import free_port


class RankFailure(RuntimeError):
    """One or more ranks raised, died or timed out."""


def _rank_main(rank: int, world: int, port: int, timeout_s: float, conn) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import gc
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    gc.freeze()     # what the forkserver imported stays for good: a full collection need not walk it (~0.8 s)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        conn.send(("ready", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        fn, args, kwargs = msg
        try:
            conn.send(("ok", fn(*args, **kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


#: The runtime a rank uses (``import axgrid`` alone loads none of it: its names load on first use), and the memory
#: measurement tools (whose dispatch mode imports torch._dynamo: once in the forkserver, not once per rank).
RUNTIME_MODULES = ("axgrid.core.grid", "axgrid.core.runtime", "axgrid.nn", "axgrid.tensor_parallel.linear",
                   "axgrid.plans.parallelize", "axgrid.plans", "axgrid.checkpoint", "axgrid.data_parallel.gradients",
                   "axgrid.io.export", "axgrid.tensor_parallel.redistribute", "axgrid.launch.env",
                   "axgrid.metrics.memtrack")


def forkserver_context(preload: Sequence[str] = ()) -> Any:
    """The forkserver context of ranks and isolated runs, with torch and the runtime preloaded (and ``preload``).
    The forkserver starts once per process: the first call's list is what every process it forks has imported."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", *RUNTIME_MODULES, *preload])
    return ctx


class RankPool:
    """``world_size`` rank processes with a live gloo default group, reused across ``run`` calls. ``preload``:
    more modules the rank processes' forkserver imports once (e.g. ``transformers``' model modules), so that
    each rank does not import them again."""

    def __init__(self, world_size: int, timeout_s: float = 60.0, preload: Sequence[str] = ()) -> None:
        self.world_size, self.timeout_s, self.preload = world_size, timeout_s, list(preload)
        self._procs: list[Any] = []
        self._conns: list[Any] = []

    def _start(self) -> None:
        ctx = forkserver_context(self.preload)
        port = free_port()
        for r in range(self.world_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_rank_main, args=(r, self.world_size, port, self.timeout_s, child), daemon=True)
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)
        self._collect("start", self.timeout_s + 30)

    def _collect(self, what: str, deadline_s: float) -> list[Any]:
        end = time.monotonic() + deadline_s
        results: list[Any] = [None] * self.world_size
        errors: dict[int, str] = {}
        waiting = set(range(self.world_size))
        while waiting:
            for r in list(waiting):
                c = self._conns[r]
                try:
                    ready = c.poll(0.02)
                except (EOFError, OSError):
                    ready = True
                if ready:
                    try:
                        status, value = c.recv()
                    except (EOFError, OSError):
                        status, value = "error", f"rank {r} died (exit code {self._procs[r].exitcode})"
                    waiting.discard(r)
                    if status == "error":
                        errors[r] = value
                        end = min(end, time.monotonic() + 5.0)  # give the others a moment to fail too
                    else:
                        results[r] = value
                elif not self._procs[r].is_alive():
                    waiting.discard(r)
                    errors[r] = f"rank {r} died (exit code {self._procs[r].exitcode})"
            if waiting and time.monotonic() > end:
                for r in waiting:
                    errors[r] = f"rank {r} did not answer within the deadline ({what})"
                break
        if errors:
            self.close()
            by_text: dict[str, list[int]] = {}
            for r in sorted(errors):
                by_text.setdefault(errors[r], []).append(r)
            detail = "\n".join(f"--- rank(s) {ranks} ---\n{text}" for text, ranks in by_text.items())
            raise RankFailure(f"{len(errors)} of {self.world_size} ranks failed in {what}:\n{detail}")
        return results

    def run(self, fn: Callable, *args: Any, deadline_s: Optional[float] = None, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; returns the results in rank order."""
        if not self._procs:
            self._start()
        for c in self._conns:
            c.send((fn, args, kwargs))
        return self._collect(getattr(fn, "__name__", "call"), deadline_s or self.timeout_s + 30)

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(None)
            except Exception:
                pass
        for p in self._procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        self._procs, self._conns = [], []

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
