"""One rank of a fault-injection job (:mod:`axgrid.testing.faults` starts it on 2 ranks under a launcher).

    python -m axgrid.testing.fault_rank MODE BAD_RANK TIMEOUT_S [TAG]

Every rank builds a pure data-parallel grid (collective timeout TIMEOUT_S) and all-reduces a small tensor in a
loop. At step 3 rank BAD_RANK prints ``FAIL <unix time>`` and misbehaves: ``raise`` (an uncaught exception, a bug),
``refuse`` (one of the project's errors, a :class:`~axgrid.data.indexed.DataError` naming a bad shard),
``exit`` (``sys.exit(7)``), ``hang`` (sleeps, never reaching the next collective), ``kill`` (SIGKILLs itself),
``skip`` (each step also all-gathers 8 numbers after the all-reduce; the bad rank skips its all-reduce, so it
posts the all-gather while the others post the all-reduce: both wait until the collective timeout).
With ``run`` nobody fails and the job runs until it is signalled; with ``finish`` it ends cleanly after 5 steps.
Each rank prints ``READY <rank> <pid>`` once its grid is up. TAG is ignored: tests find the job's processes
by it on their command lines.
"""
import os
import signal
import sys
import time

import torch

import axgrid
from axgrid.data.indexed import DataError

mode, bad, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
grid = axgrid.init("1x1x1", timeout_s=timeout_s)
print(f"READY {grid.rank} {os.getpid()}", flush=True)
t = torch.ones(4, device=grid.device)        # on the grid's device: NCCL takes GPU tensors
for step in range(10**9):
    if mode == "finish" and step == 5:
        break
    if mode == "skip":
        if grid.rank == bad and step == 3:
            print(f"FAIL {time.time():.3f}", flush=True)
        else:
            grid.comm.all_reduce(t, "d")
        grid.comm.all_gather(torch.ones(8, device=grid.device), "d")
        time.sleep(0.05)
        continue
    if grid.rank == bad and step == 3 and mode in ("raise", "refuse", "exit", "hang", "kill"):
        print(f"FAIL {time.time():.3f}", flush=True)
        if mode == "raise":
            raise RuntimeError(f"rank {grid.rank} fails on purpose")
        if mode == "refuse":
            raise DataError(f"shard-00007.bin: bad magic on rank {grid.rank}; rerun preprocessing")
        if mode == "exit":
            sys.exit(7)
        if mode == "hang":
            time.sleep(3600)
        os.kill(os.getpid(), signal.SIGKILL)
    grid.comm.all_reduce(t, "d")
    time.sleep(0.05)
grid.destroy()
