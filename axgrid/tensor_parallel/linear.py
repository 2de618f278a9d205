"""``axgrid.nn.Linear``: Agarwal's 3D parallel matrix multiplication for one fully connected layer.

``Y = X W^T + b`` with X ``[m, k]``, W ``[n, k]``. For a normal layer (``transpose=False``), with
``m' = m / (Gd*Gz)`` this rank's tokens:

=========  ==========================================================================
X_loc      ``[m', k/Gx]``: tokens over (d, z), features over x, replicated over y
W block    ``[n/Gy, k/Gx]``: rows over y, columns over x; flattened, padded to a multiple of Gz, and
           split over z -- this rank stores ``weight`` = ``[ceil(n*k/(Gx*Gy*Gz))]`` (1-D)
b          ``[n/Gy]``: features over y, replicated over x and z
Y_loc      ``[m', n/Gy]``: tokens over (d, z), features over y, replicated over x
=========  ==========================================================================

Forward ``W_blk = AG_z(W_shard)``, ``Y = AR_x(X_loc W_blk^T) + b``. Backward ``dX = AR_y(dY W_blk)``,
``dW_blk = dY^T X_loc``, ``dW_shard = RS_z(dW_blk)``, ``db = AR_z(sum_tokens dY)``; the data-parallel mean over d
is done once per step by :func:`axgrid.sync_gradients`. A transposed layer swaps the roles of x and y, so a
normal layer's output layout is a transposed layer's input layout (and the other way round).
"""
from __future__ import annotations

from typing import Any, Literal, Optional

import torch
from torch import nn

from ..core.grid import Grid, current_grid
from ..spec.tiles import Box
from ..io.part_copy import copy_part_, read_part
from .redistribute import gather_tokens_features, shard_tokens_features
from ..io.state_dict import add_state_hooks, deepcopy_keeping_marks
from ..spec import LinearSharding
from ..nn import init as _init
from .replicated_grad import token_grad, uses_token

ActivationLayout = Literal["replicated", "sharded"]




class _LinearFunction(torch.autograd.Function):
    """The 3D matmul on this rank's pieces: ``x_loc [m', k_blk]`` -> ``y_loc [m', n_blk]``."""

    @staticmethod
    def forward(ctx, x_loc: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],  # type: ignore[override]
                layer: "Linear", uses: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``uses``: the gradient sink's uses token for this layer (ORS; see :mod:`axgrid.tensor_parallel.overlap`), or
        None."""
        grid, rt, sh = layer.grid, layer.runtime, layer.sharding
        dev = x_loc.device.type
        if torch.is_autocast_enabled(dev) and x_loc.is_floating_point():
            # both GEMMs read the input in the autocast dtype: cast once, and save that (e.g. a layer norm's fp32
            # output is saved at half the size; the same values as the GEMMs' own casts)
            x_loc = x_loc.to(torch.get_autocast_dtype(dev))
        w_blk, saved = rt.weights.forward(layer, weight)           # [n_blk, k_blk]; the block or the shard
        if bias is not None and grid.size(sh.in_dim) == 1 and rt.gemm_is_matmul:
            # nothing to reduce: the bias rides in the GEMM (as in F.linear), no extra pass over the output
            y = torch.addmm(bias, x_loc, w_blk.t())                  # [m', n_blk]
        else:
            y = rt.gemm(x_loc, w_blk.t(), "forward")                  # [m', n_blk], partial over in_dim
            y = grid.comm.all_reduce(y, sh.in_dim)                      # a fresh buffer: safe to add into
            if bias is not None:
                y.add_(bias.to(y.dtype))    # under autocast, like F.linear: the output keeps the GEMM's dtype
        ctx.layer = layer
        ctx.has_bias = bias is not None
        ctx.autocast = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        ctx.save_for_backward(x_loc, saved)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        dev, enabled, dtype = ctx.autocast
        with torch.autocast(dev, dtype=dtype, enabled=enabled):   # the forward's precision, in backward too
            return _LinearFunction._backward(ctx, dy)

    @staticmethod
    def _backward(ctx, dy: torch.Tensor):
        layer: Linear = ctx.layer
        grid, rt, sh = layer.grid, layer.runtime, layer.sharding
        x_loc, saved = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        dy = dy.contiguous()
        dx = dx_pending = dw_shard = db = None
        w_blk = rt.weights.backward(layer, saved, need_x)          # [n_blk, k_blk] when need_x, else None
        if need_x:                                                  # (the same decision on every rank: SPMD)
            dx = rt.gemm(dy, w_blk, "input_grad")                   # [m', k_blk], partial over out_dim
            dx_pending = rt.grads.reduce_input_grad(dx, sh.out_dim)  # in flight under the next GEMM with OAR
        if need_w:
            weight = layer.weight
            dw_blk = rt.gemm(dy.t(), x_loc, "weight_grad")          # [n_blk, k_blk]
            flat = dw_blk.reshape(-1).to(rt.grad_dtype(weight))       # reduced in fp32 by default (config)
            if sh.padded_numel != sh.block_numel:
                flat = torch.cat([flat, flat.new_zeros(sh.padded_numel - sh.block_numel)])
            dw_shard = rt.grads.reduce_scatter(weight, flat)        # None: the sink writes .grad itself (ORS)
        if need_b:
            bias = layer.bias
            (db,) = rt.grads.all_reduce([bias], [dy.sum(0).to(rt.grad_dtype(bias))], "z")
        if dx_pending is not None:
            dx = dx_pending.wait()
        # the uses token: autograd sums it over this pass's uses and fires its hook after the last one ran
        return dx, dw_shard, db, None, token_grad(ctx, 4, dy)


class Linear(nn.Module):
    """A drop-in parallel ``nn.Linear`` on the grid (see the module docstring for the sharding).

    ``input_layout``/``output_layout``: ``"replicated"`` (default) takes and returns what an ``nn.Linear`` would
    on this rank -- ``[..., in_features]`` -> ``[..., out_features]``, replicated over the tensor-parallel block --
    and redistributes internally. ``"sharded"`` takes/returns the layer layout (``[..., k_blk]`` /
    ``[..., n_blk]``, tokens already split over (d, z)): use it between a normal and a transposed layer,
    whose layouts match, to skip the redistribution.

    Initialisation is :mod:`axgrid.nn.init`'s hashed scheme: each rank computes its own shard, and the layer
    equals ``init.reference_linear(in, out, bias, seed)`` sliced. ``seed`` defaults to one drawn from the
    grid's seed and the layer's construction order (identical on every rank). ``init=False`` leaves the
    parameters uninitialised (``torch.empty``) for a loader that fills them.

    ``out_segments``: a fused layer (Phi-3's ``qkv_proj``, ``gate_up_proj``) whose output features are consecutive
    segments, each split over the output dimension on its own, so that this rank's sharded output is its share of
    every segment in turn (``[q_loc | k_loc | v_loc]``); the weight's tile carries the row map, so loading,
    checkpoints and export see the dense tensor in its own row order. Only with a sharded output.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, transpose: bool = False, *,
                 grid: Optional[Grid] = None, input_layout: ActivationLayout = "replicated",
                 output_layout: ActivationLayout = "replicated", seed: Optional[int] = None,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None,
                 init: bool = True, out_segments: tuple[int, ...] = ()) -> None:
        super().__init__()
        for name, v in (("input_layout", input_layout), ("output_layout", output_layout)):
            if v not in ("replicated", "sharded"):
                raise ValueError(f"{name}={v!r} must be 'replicated' or 'sharded'")
        if len(out_segments) > 1 and output_layout != "sharded":
            raise ValueError(f"out_segments={tuple(out_segments)} needs output_layout='sharded' (a gathered output "
                             f"would come back in the segments' layout order)")
        self.grid = grid or current_grid()
        self.in_features, self.out_features, self.transpose = in_features, out_features, transpose
        self.input_layout, self.output_layout = input_layout, output_layout
        self.sharding = LinearSharding.of(self.grid.shape, self.grid.coord, in_features, out_features, transpose,
                                          tuple(out_segments))
        self.runtime = self.grid.runtime
        self.seed = self.runtime.seeds.next() if seed is None else seed
        dtype = dtype or torch.get_default_dtype()
        device = device or self.grid.device
        self.weight = nn.Parameter(torch.empty(self.sharding.shard_numel, dtype=dtype, device=device))
        sh = self.sharding
        self.weight.axgrid_replicated = "d"            # distinct over x, y, z
        self.weight.axgrid_tile = sh.weight_tile
        if bias:
            self.bias = nn.Parameter(torch.empty(self.sharding.n_blk, dtype=dtype, device=device))
            self.bias.axgrid_replicated = self.sharding.in_dim + "zd"
            self.bias.axgrid_tile = sh.bias_tile
        else:
            self.register_parameter("bias", None)
        self.lora: Optional[nn.Module] = None      # a LoRA adapter (axgrid.adapters.layer), set by axgrid.lora
        if init:
            self.reset_parameters()
        add_state_hooks(self)

    __deepcopy__ = deepcopy_keeping_marks     # the copy keeps its TileSpecs and shares the grid

    # -- parameters -----------------------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """Fill this rank's shards from the hashed initialisation (no communication, no full matrix)."""
        sh, b, dev = self.sharding, _init.linear_bound(self.in_features), self.weight.device
        with torch.no_grad():
            self.weight.copy_(self._shard_from(lambda rows, cols: _init.uniform_block(
                self.seed, _init.WEIGHT_STREAM, self.in_features, rows, cols, b, torch.float64, dev)))
            if self.bias is not None:
                self.bias.copy_(read_part(sh.bias_tile, lambda box: _init.uniform_block(
                    self.seed, _init.BIAS_STREAM, self.out_features, range(1),
                    range(box.offsets[0], box.offsets[0] + box.shape[0]), b, torch.float64, dev)[0],
                    dtype=torch.float64, device=dev))

    def _shard_from(self, block_of) -> torch.Tensor:
        """This rank's flat shard, computed from ``block_of(rows, cols) -> [rows, cols]`` of the dense matrix
        (called for each box of the shard, :func:`axgrid.spec.tiles.part_boxes`)."""
        def read(box: Box) -> torch.Tensor:
            (r, c), (nr, nc) = box.offsets, box.shape
            return block_of(range(r, r + nr), range(c, c + nc))
        return read_part(self.sharding.weight_tile, read, dtype=torch.float64, device=self.weight.device)

    def load_dense_(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> "Linear":
        """Copy this rank's pieces from a dense ``weight [out, in]`` (and ``bias [out]``) held on this rank."""
        sh = self.sharding
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"dense weight has shape {tuple(weight.shape)}, expected "
                             f"({self.out_features}, {self.in_features})")
        with torch.no_grad():
            copy_part_(sh.weight_tile, weight, self.weight)
            if self.bias is not None:
                if bias is None:
                    raise ValueError("this layer has a bias but no dense bias was given")
                copy_part_(sh.bias_tile, bias, self.bias)
        return self

    @classmethod
    def from_dense(cls, dense: nn.Linear, grid: Optional[Grid] = None, transpose: bool = False,
                   **kwargs: Any) -> "Linear":
        """A parallel copy of ``dense`` (held in full on every rank) on the grid's device: its parameters are made
        uninitialised and filled once from ``dense``. A ``dense`` on the meta device (a model built without memory,
        :func:`axgrid.from_pretrained`) gives an uninitialised layer."""
        meta = dense.weight.device.type == "meta"
        layer = cls(dense.in_features, dense.out_features, bias=dense.bias is not None, transpose=transpose,
                    grid=grid, dtype=dense.weight.dtype, init=False, **kwargs)
        return layer if meta else layer.load_dense_(dense.weight, dense.bias)

    def to_dense(self) -> nn.Linear:
        """The whole layer as an ``nn.Linear`` on every rank (collective over the tensor-parallel block)."""
        sh, comm = self.sharding, self.grid.comm
        for p in self.parameters():
            self.runtime.dp.before_use(p)          # zero >= 1 with ODP: the last step's all-gather over d first
        with torch.no_grad():
            blk = self.runtime.weights.gather(self, self.weight.detach())    # [n_blk, k_blk]
            cols = comm.all_gather(blk, sh.in_dim)                           # [G_in, n_blk, k_blk]
            rows = torch.cat(list(cols.unbind(0)), dim=1)                    # [n_blk, k]
            full = torch.cat(list(comm.all_gather(rows, sh.out_dim).unbind(0)), dim=0)  # [n, k] (layout order)
            bias = None
            if self.bias is not None:
                bias = torch.cat(list(comm.all_gather(self.bias.detach(), sh.out_dim).unbind(0)))
            if sh.row_map:                                                   # a fused layer: back to dense order
                order = torch.cat([torch.arange(a, a + n) for a, n in sh.row_map])
                full = torch.empty_like(full).index_copy_(0, order.to(full.device), full)
                bias = None if bias is None else torch.empty_like(bias).index_copy_(0, order.to(bias.device), bias)
            dense = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                              dtype=full.dtype, device=full.device)
            dense.weight.copy_(full)
            if bias is not None:
                dense.bias.copy_(bias)
        return dense

    # -- forward ---------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` (replicated input) or ``[..., k_blk]`` (sharded input) -> see the class doc."""
        sh = self.sharding
        if x.dim() == 0:                # checked before any collective, identically on every rank
            feats = self.in_features if self.input_layout == "replicated" else sh.k_blk
            raise ValueError(f"axgrid.nn.Linear got a 0-d tensor (a scalar); it takes inputs of shape "
                             f"[..., {feats}] ({self.input_layout} input features)")
        lead = x.shape[:-1]
        if self.input_layout == "replicated":
            if x.shape[-1] != self.in_features:
                raise ValueError(f"input has {x.shape[-1]} features, layer expects in_features={self.in_features}")
            x2 = x.reshape(-1, self.in_features)
            self._tokens = (lead, x2.shape[0])   # for a paired layer that gathers our tokens back
            x_loc = shard_tokens_features(x2, self.grid, sh.in_dim)
        else:
            if x.shape[-1] != sh.k_blk:
                raise ValueError(f"sharded input has {x.shape[-1]} features, this rank's part is "
                                 f"in_features/G{sh.in_dim} = {sh.k_blk}")
            x_loc = x.reshape(-1, sh.k_blk)
        y_loc = _LinearFunction.apply(x_loc, self.weight, self.bias, self,
                                      uses_token(self.grid, [self.weight, self.bias]))
        if self.lora is not None:                  # + s·(drop(x) A^T) B^T, in the same layout (axgrid.adapters.layer)
            y_loc = y_loc + self.lora(x_loc)
        if self.output_layout == "sharded":
            return y_loc.reshape(*lead, sh.n_blk) if self.input_layout == "sharded" else y_loc
        if self.input_layout == "replicated":
            return gather_tokens_features(y_loc, self.grid, sh.out_dim, x2.shape[0]).reshape(*lead, self.out_features)
        source = self.__dict__.get("tokens_from")  # the replicated-input layer this one is paired with
        if source is not None and getattr(source, "_tokens", None) is not None:
            lead, m = source._tokens
            return gather_tokens_features(y_loc, self.grid, sh.out_dim, m).reshape(*lead, self.out_features)
        return gather_tokens_features(y_loc, self.grid, sh.out_dim)     # token count agreed over z

    def pair_after(self, source: "Linear") -> "Linear":
        """Declare that this layer's sharded input comes (through per-token elementwise ops) from ``source``'s
        sharded output, so this layer's replicated output takes back ``source``'s leading dims and token count."""
        self.__dict__["tokens_from"] = source   # a plain reference, not a submodule
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"transpose={self.transpose}, grid={self.grid.shape}, input={self.input_layout}, "
                f"output={self.output_layout}")


def kept_weight_bytes(model: nn.Module) -> int:
    """Extra memory ``keep_gathered_weights`` holds per micro-batch: each layer's gathered block minus its shard."""
    total = 0
    for m in model.modules():
        if isinstance(m, Linear) and m.grid.size("z") > 1:
            total += (m.sharding.block_numel - m.sharding.shard_numel) * m.weight.element_size()
    return total
