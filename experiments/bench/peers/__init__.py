"""The contenders of ``bench_peers.py``, each one training configuration with the same interface.

A :class:`Contender` holds a model, its optimizer and its slice of one fixed global batch; ``step()`` runs one
training step (forward, backward, gradient synchronisation, optimizer step), ``loss()`` the global loss on the
whole batch without changing anything, ``count_bytes()`` one step while counting the bytes it communicates
(ledger convention: the all-reduced tensor, the all-gather's output, the reduce-scatter's input; this rank).

Workloads (same math everywhere, same initial weights from axgrid's hashed initialisation):

- ``mlp``: ``axgrid.models.MLPStack`` -- ``depth`` blocks ``x + down(gelu(up(x)))``, ``h -> 4h -> h`` --, loss
  ``mean(y^2)`` over ``tokens`` tokens of width ``h``, SGD.
- ``gpt``: ``axgrid.models.GPT``, next-token cross entropy on ``batch`` sequences, SGD.

Contenders: ``axgrid`` on a grid (any Gx x Gy x Gz x Gd), and PyTorch's own: DTensor 1-D TP (Megatron plan:
up/QKV ``ColwiseParallel``, down/proj ``RowwiseParallel``, every rank the whole batch), DTensor 2-D TP x DP
(the same plan over the ``tp`` mesh dimension, the batch split over ``dp``, gradients averaged over ``dp`` in
one flat all-reduce), DDP (the batch split over all ranks) and FSDP2 (``fully_shard`` per block and at the root).

Several axgrid grids live side by side in one process (interleaved timing needs them all alive), so they are
built with :func:`side_grid` rather than ``axgrid.init``, which allows one grid per process.
"""
from .comm_bytes import byte_comm_mode
from .contenders import (AxgridContender, Contender, DDPContender, DTensorContender, FSDP2Contender, build_peers)
from .workload import Workload, add_workload_args, candidate_grids, mlp_loss, side_grid, workload_from_args

__all__ = ["byte_comm_mode", "AxgridContender", "Contender", "DDPContender", "DTensorContender", "FSDP2Contender",
           "build_peers", "Workload", "add_workload_args", "candidate_grids", "mlp_loss", "side_grid",
           "workload_from_args"]
