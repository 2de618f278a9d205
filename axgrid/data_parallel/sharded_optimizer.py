"""An optimizer whose state is sharded over the data-parallel ranks (``RuntimeConfig(zero=1|2)``: ZeRO stages 1 and 2).

    opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=3e-4)
    opt = axgrid.shard_optimizer(opt, model, grid)    # zero=0: opt itself; zero >= 1: a ShardedOptimizer
    axgrid.train_step(model, opt, loss_of, grid, microbatches=4, clip=1.0)

Each d-rank owns a 1/Gd share of every flat data-parallel bucket (:mod:`axgrid.spec.buckets`,
:mod:`axgrid.data_parallel.buckets`): after the gradients are reduce-scattered over d, it runs the wrapped optimizer's
algorithm (its class, groups and hyper-parameters) on *pieces* -- the part of each parameter inside its shares,
leaf tensors that share storage with the bucket's parameter buffer, their gradients views of the reduced share --
so its state (AdamW's two moments: 8 bytes per element) exists for 1/Gd of the elements; then the updated shares
are all-gathered over d in place, in flight into the next forward with ODP. Elementwise optimizers (SGD, Adam,
AdamW, ...) give the unsharded optimizer's results; one that couples elements of a tensor (LAMB's trust ratio,
Adafactor's factored moments) would not, and is not supported.

Why our own and not a library's: torch's ``ZeroRedundancyOptimizer`` assigns whole parameters to ranks (our
embedding table would sit on one rank), expects gradients all-reduced beforehand (no reduce-scatter, so no saving
in gradient memory or in communication) and broadcasts parameters outside ``grid.comm`` (no ledger, no configured
reduction precision). FSDP2 (``fully_shard``) shards parameters per tensor on dim 0 as DTensors and all-gathers
them around every forward and backward: that is ZeRO-3, which axgrid's z dimension already does inside a
tensor-parallel block, and it would replace the z-sharded 1-D weights and the box-based checkpoints. Megatron's
distributed optimizer is the design followed here (contiguous buckets in reverse parameter order, padded to a
multiple of the data-parallel size, a rank's share of each bucket, optimizer groups built from the pieces), but it
is bound to Megatron's process-group state and model classes.

Checkpoints (:mod:`axgrid.checkpoint`) save each piece's state as boxes of the dense tensor (its ``TileSpec`` with
``piece``), so a sharded state loads onto another Gd, onto ``zero=0`` and back (the boxes are the same format).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .gradients import trainable_params
from .buckets import GradBuckets, Piece
from ..io import replicated_letters, tile_of
from ..spec import TileSpec

if TYPE_CHECKING:
    from ..core.grid import Grid


def piece_tile(param: torch.Tensor, lo: int, hi: int) -> TileSpec:
    """The :class:`~axgrid.spec.TileSpec` of the elements ``[lo, hi)`` of ``param`` (flat): its own tile (a dense
    parameter: the whole tensor) narrowed to that piece."""
    tile = tile_of(param)
    if tile is None:
        shape = tuple(param.shape)
        tile = TileSpec(shape, (0,) * len(shape), shape)
    return dataclasses.replace(tile, piece=(lo, hi))


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer``'s algorithm on this d-rank's pieces of ``model``'s parameters (see the module docstring).

    ``param_groups`` are the wrapped optimizer's groups (same order and hyper-parameters: setting ``lr`` there
    works, as do torch's LR schedulers) holding the pieces; ``state`` is keyed by piece. :meth:`step` reduces the
    gradients if :func:`axgrid.sync_gradients` has not, steps, and all-gathers the parameters over d;
    :meth:`zero_grad` zeroes the gradient buffers in place. ``model_groups`` / :meth:`piece_of` tell which model
    parameter each piece is (the checkpoint uses them)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, grid: "Grid") -> None:
        zero = grid.runtime.config.zero
        if zero < 1:
            raise ValueError("ShardedOptimizer needs RuntimeConfig(zero=1 or 2); use axgrid.shard_optimizer")
        if isinstance(optimizer, ShardedOptimizer):
            raise ValueError("the optimizer is sharded already")
        if any(optimizer.state.values()):
            raise ValueError(f"{type(optimizer).__name__} has state already: shard it before its first step (and "
                             f"load checkpoints into the sharded optimizer)")
        params = trainable_params(model)
        buckets = grid.runtime.dp.buckets_for(params)
        assert buckets is not None         # zero >= 1 needs Gd > 1, checked by axgrid.init
        self.buckets: GradBuckets = buckets
        #: the buckets it steps: the model's, and the experts' (sharded over their replica group "r") when it has any
        self.sets: list[GradBuckets] = [buckets] + ([buckets.experts] if buckets.experts is not None else [])
        self.grid = grid
        by_id = {id(pc.param): pc for b in self.sets for pc in b.pieces()}
        self.model_groups: list[list[torch.nn.Parameter]] = []
        self._pieces: dict[int, Piece] = {}           # id(piece tensor) -> its Piece
        groups = []
        for gi, g in enumerate(optimizer.param_groups):
            ps = []
            for p in g["params"]:
                pc = by_id.get(id(p))
                if pc is None:
                    raise ValueError(f"parameter group {gi} holds a tensor of shape {tuple(p.shape)} that is not a "
                                     f"trainable parameter of the model: build the optimizer from the model's "
                                     f"parameters")
                q = torch.nn.Parameter(pc.data, requires_grad=True)   # a leaf sharing the bucket's storage
                q.grad = pc.grad
                self._pieces[id(q)] = pc
                ps.append(q)
            self.model_groups.append(list(g["params"]))
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ps})
        cls = type(optimizer)
        accepted = inspect.signature(cls.__init__).parameters
        super().__init__(groups, dict(optimizer.defaults))
        self.inner = cls(self.param_groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})
        self.state = self.inner.state                # one state, one list of groups: the inner optimizer's
        self.param_groups = self.inner.param_groups
        if self.buckets.odp:
            for b in self.sets:
                b.hook_modules(model)

    def piece_of(self, tensor: torch.Tensor) -> Piece:
        """The :class:`~axgrid.data_parallel.buckets.Piece` a tensor of ``param_groups`` is."""
        return self._pieces[id(tensor)]

    @property
    def checkpoint_class(self) -> str:
        """The algorithm's class name (what a checkpoint records: a sharded AdamW's state is AdamW's)."""
        return type(self.inner).__name__

    def checkpoint_slots(self) -> list[list[tuple[torch.nn.Parameter, torch.Tensor, TileSpec, str]]]:
        """Per group, per model parameter: (the parameter, its piece -- the tensor ``state`` is keyed by --, the
        piece's TileSpec, the grid letters holding identical copies of it: the parameter's less d)."""
        out = []
        for model_params, g in zip(self.model_groups, self.param_groups):
            row = []
            for p, q in zip(model_params, g["params"]):
                pc = self._pieces[id(q)]
                row.append((p, q, piece_tile(p, pc.lo, pc.hi), replicated_letters(p).replace("d", "")))
            out.append(row)
        return out

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        """Reduce the gradients if the backward (or :func:`axgrid.sync_gradients`) has not, step the pieces of
        every parameter some d-rank has a gradient for (the others are skipped, as torch skips a parameter whose
        ``.grad`` is None), and all-gather the parameters over d."""
        if closure is not None:
            raise ValueError("ShardedOptimizer.step takes no closure: run the forward and backward first")
        for b in self.sets:
            b.settle()                      # a gather still in flight (two steps without a forward)
        self.grid.runtime.grads.finish()    # ORS: the last gradients arrive
        for b in self.sets:
            b.reduce()                      # a no-op when the backward (or sync_gradients) did it
        used = set().union(*(b.used_params() for b in self.sets))
        skipped = [q for g in self.param_groups for q in g["params"] if id(self._pieces[id(q)].param) not in used]
        for q in skipped:
            q.grad = None
        try:
            self.inner.step()
        finally:
            for q in skipped:
                q.grad = self._pieces[id(q)].grad
        for b in self.sets:
            b.stepped()
            b.gather_params(async_op=b.odp)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients in place in their buckets (the buckets are the gradients' storage); with
        ``set_to_none`` the parameters count as having no gradient until one arrives, as torch's."""
        for b in self.sets:
            b.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """This rank's pieces' state (per rank; :mod:`axgrid.checkpoint` saves a reshardable form)."""
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)
        self.state = self.inner.state
        self.param_groups = self.inner.param_groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "inner", None) is None:      # the base class' constructor adds the initial groups
            return super().add_param_group(param_group)
        raise NotImplementedError("ShardedOptimizer: add the group to the optimizer before sharding it")


def shard_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, grid: "Grid") -> torch.optim.Optimizer:
    """``optimizer`` with its state sharded over d as ``grid``'s ``RuntimeConfig.zero`` says: the optimizer itself
    with ``zero=0``, else a :class:`ShardedOptimizer` over ``model``'s trainable parameters. Call it before the
    first step and before loading a checkpoint (drivers call it unconditionally)."""
    if grid.runtime.config.zero == 0:
        return optimizer
    return ShardedOptimizer(optimizer, model, grid)


__all__ = ["ShardedOptimizer", "shard_optimizer"]
