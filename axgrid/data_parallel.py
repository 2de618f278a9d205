"""Data parallelism over d, and a global gradient norm that counts every parameter element once.

Each parameter may carry ``axgrid_replicated``: the grid letters it is replicated over (``"d"`` for a
weight shard, ``"xzd"`` for a normal layer's bias). Parameters without it (dense modules left in a
parallelized model) are replicated over the whole grid: ``"xyzd"``.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, Optional

import torch

if TYPE_CHECKING:
    from .grid import Grid


def local_batch(batch: torch.Tensor, grid: Grid, dim: int = 0) -> torch.Tensor:
    """This rank's share of a global batch: the rows of its data-parallel index d.

    ``batch [B, ...]`` (the same global batch on every rank) -> ``[B/Gd, ...]``, rows ``d·B/Gd`` to
    ``(d+1)·B/Gd - 1`` along ``dim`` (a view). Every rank of one x·y·z block gets the same rows; the model splits
    them further over z inside: axgrid's GPT and the Hugging Face plans by whole sequences (``B/Gd`` must then be a
    multiple of Gz), a drop-in ``axgrid.nn.Linear`` by tokens. ``sync_gradients`` then averages over d, so the
    mean loss of each share gives the gradient of the mean over the whole batch.

        ids = axgrid.local_batch(batch, grid)          # batch [B, S] -> ids [B/Gd, S]
    """
    if batch.dim() == 0:
        raise ValueError("local_batch got a 0-d tensor; pass the global batch [B, ...]")
    b, gd = batch.shape[dim], grid.size("d")
    if b % gd:
        raise ValueError(f"a global batch of {b} rows (dim {dim}) does not split over Gd={gd} data-parallel ranks of "
                         f"grid {grid.shape}; use a batch that is a multiple of {gd}")
    per = b // gd
    return batch.narrow(dim, grid.coord.d * per, per)


def replicated_over(p: torch.Tensor) -> str:
    return getattr(p, "axgrid_replicated", "xyzd")


def _params(params: Iterable[torch.Tensor] | torch.nn.Module) -> list[torch.Tensor]:
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    return [p for p in params if p.requires_grad]


def finish_gradients(grid: Grid) -> None:
    """Complete every gradient collective still in flight (ORS / ODP) and write the results to ``.grad``."""
    grid.runtime.grads.finish()


def sync_gradients(params: Iterable[torch.Tensor] | torch.nn.Module, grid: Grid) -> None:
    """Average ``.grad`` over the data-parallel dimension d, in buckets of ``RuntimeConfig.bucket_bytes``.

    Call once per optimizer step, after the last micro-batch's backward. Completes pending overlapped
    gradient collectives first. With the ODP overlap on, gradients already synchronised during backward
    are not reduced again. Every trainable parameter is reduced, in ``params`` order; one without a gradient
    on this rank contributes zeros (and receives the mean). ODP itself, like DDP's default, needs every
    watched parameter to get a gradient in every synchronised backward.
    """
    rt = grid.runtime
    rt.grads.finish()
    if grid.size("d") == 1:
        return
    done = set(rt.grads.synced)
    rt.grads.synced.clear()     # consumed: the next step starts from nothing synced
    # Every rank reduces the same parameters in the same order: a parameter without a gradient on this rank
    # (unused in its branch) contributes zeros, so buckets line up across d and the mean stays right.
    todo = [p for p in _params(params) if id(p) not in done]
    for p in todo:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for bucket in _buckets(todo, rt.config.bucket_bytes):
        flat = flat_grads(bucket, rt.grad_buffers)
        write_grads(bucket, grid.comm.all_reduce(flat.to(rt.grad_dtype(flat)), "d", average=True))
    rt.grad_buffers.end_step()


def _buckets(params: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Consecutive groups of ``params`` whose gradients fit in ``limit`` bytes and share a dtype (a gradient
    larger than the limit gets a bucket of its own)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        nbytes = p.grad.numel() * p.grad.element_size()
        if not out or size + nbytes > limit or p.grad.dtype != out[-1][0].grad.dtype:
            out.append([])
            size = 0
        out[-1].append(p)
        size += nbytes
    return out


class BucketBuffers:
    """Flat bucket buffers kept across steps (as DDP keeps its buckets), one per bucket layout.

    A layout is the ordered list of a bucket's parameters with their gradients' shape, dtype and device; a
    buffer is ``[sum of numels]`` of that dtype on that device, fully overwritten on each use, so a layout only
    ever gets a buffer of exactly its size. The owner calls :meth:`end_step` after every step's collectives
    completed (never while one on a buffer is in flight); a buffer no step used in the last ``keep_steps``
    steps that used any is freed, so a changed model does not keep the old one's buffers alive. A layout asked
    for twice in one step (its first buffer may still be in flight) gets a fresh tensor the second time.
    """

    def __init__(self, keep_steps: int = 2) -> None:
        self.keep_steps = keep_steps
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.last_used: dict[tuple, int] = {}
        self.step = 0
        self.taken: set[tuple] = set()      # layouts handed out since the last end_step

    def get(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The buffer for ``params``' layout: ``[sum(p.grad.numel())]``, contents undefined."""
        g0 = params[0].grad
        key = (g0.dtype, g0.device, *((id(p), p.grad.shape) for p in params))
        numel = sum(p.grad.numel() for p in params)
        if key in self.taken:
            return torch.empty(numel, dtype=g0.dtype, device=g0.device)
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = torch.empty(numel, dtype=g0.dtype, device=g0.device)
        self.last_used[key] = self.step
        self.taken.add(key)
        return buf

    def end_step(self) -> None:
        """Every collective on the buffers completed: age them; free those unused for ``keep_steps`` steps."""
        if not self.taken:
            return                          # e.g. a no_sync backward: nothing reduced, nothing ages
        self.step += 1
        self.taken.clear()
        for key in [k for k, s in self.last_used.items() if self.step - s > self.keep_steps]:
            del self.buffers[key], self.last_used[key]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())


def flat_grads(params: list[torch.Tensor], buffers: Optional[BucketBuffers] = None) -> torch.Tensor:
    """The gradients of ``params`` concatenated into one 1-D tensor (one collective for a bucket): into the
    persistent buffer ``buffers`` keeps for this layout when given (not while torch.compile traces)."""
    grads = [p.grad.detach().reshape(-1) for p in params]
    if buffers is None or torch.compiler.is_compiling():
        return torch.cat(grads)
    return torch.cat(grads, out=buffers.get(params))


def write_grads(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy a reduced :func:`flat_grads` buffer back into the gradients of ``params``."""
    off = 0
    for p in params:
        p.grad.copy_(flat[off: off + p.grad.numel()].view_as(p.grad))
        off += p.grad.numel()


def grad_norm(params: Iterable[torch.Tensor] | torch.nn.Module, grid: Grid, norm_type: float = 2.0) -> torch.Tensor:
    """Global norm of all gradients, each element counted once however it is sharded or replicated.

    A rank contributes a parameter only if its coordinate is 0 along every grid letter the parameter is
    replicated over (so replicas are skipped), then the tensor-parallel block sums. Gradients are assumed
    synchronised over d (call :func:`sync_gradients` first).
    """
    ps = [p for p in _params(params) if p.grad is not None]
    device = ps[0].grad.device if ps else grid.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in ps:
        if any(grid.coord[c] != 0 for c in replicated_over(p) if c != "d"):
            continue
        # each tensor's norm in its own dtype (a reduction: no temporary the size of the gradient; an fp64 copy of
        # a 2.1e9-element table gradient would hold 17 GB, seen by the dry run), combined in fp64
        n = torch.linalg.vector_norm(p.grad.detach(), norm_type).double()
        total = torch.maximum(total, n) if math.isinf(norm_type) else total + n ** norm_type
    if grid.size("xyz") > 1:
        if math.isinf(norm_type):
            stacked = grid.comm.all_gather(total.reshape(1), "xyz")
            total = stacked.max()
        else:
            total = grid.comm.all_reduce(total.reshape(1), "xyz")[0]
    return total if math.isinf(norm_type) else total ** (1.0 / norm_type)


def clip_grad_norm_(params: Iterable[torch.Tensor] | torch.nn.Module, max_norm: float, grid: Grid,
                    norm_type: float = 2.0) -> torch.Tensor:
    """Scale all gradients so their global norm is at most ``max_norm``; returns the norm before clipping (a 0-d
    fp32 tensor on the device). The scale is computed on the device, ``min(1, max_norm / (norm + 1e-6))``, and
    every gradient is multiplied by it: the host never waits for the norm (as ``torch.nn.utils.clip_grad_norm_``)."""
    ps = _params(params)
    norm = grad_norm(ps, grid, norm_type)
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in ps:
        if p.grad is not None:
            p.grad.detach().mul_(coef.to(p.grad.dtype))
    return norm.to(torch.float32)
