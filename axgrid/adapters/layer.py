"""``LoraAdapter``: a low-rank adapter (LoRA) on one ``axgrid.nn.Linear``, in the layer's own 3D layout.

The adapted layer computes ``Y = X W^T + s · (drop(X) A^T) B^T`` with ``A [r, k]``, ``B [n, r]`` and ``s = alpha / r``
(PEFT's ``LoraLayer``, ``use_rslora=False``). The base ``W`` is frozen. With ``m'`` this rank's tokens, ``G_in``/
``G_out`` the sizes of the layer's ``in_dim``/``out_dim`` (x/y for a normal layer, y/x for a transposed one):

=========  ========================  ========================================================================
X_loc      ``[m', k/G_in]``          the layer's input: tokens over (d, z), features over in_dim
A block    ``[r, k/G_in]``           columns as the weight's (over in_dim); replicated over out_dim, z and d
B block    ``[n/G_out, r]``          rows as the weight's (over out_dim; a fused layer's segments too);
                                     replicated over in_dim, z and d
H          ``[m', r]``               ``AR_in(X_loc A_blk^T)``; the rank r is whole on every rank
Y_loc      ``[m', n/G_out]``         ``+= s · H B_blk^T``: the layer's output layout
=========  ========================  ========================================================================

The communication the adapter adds, through ``grid.comm`` (so the ledger counts it):

- forward: one **all-reduce over in_dim of** ``[m', r]`` (H is a sum over the input features, which are split);
- backward: one **all-reduce over out_dim of** ``[m', r]``: ``dH = AR_out(s · dY B_blk)`` (a sum over the output
  features); then ``dX_loc += dH A_blk`` ``[m', k/G_in]`` and ``dA_blk = dH^T X_loc`` ``[r, k/G_in]`` need nothing
  more, and ``dB_blk = s · dY^T H`` ``[n/G_out, r]`` is already whole over in_dim (dY and H are replicated there);
- both gradients are partial over the tokens: **one all-reduce over z** of ``r·k/G_in + n/G_out·r`` elements
  (the gradient sink: in flight with ORS, as a bias's), then the data-parallel mean over d with every trainable
  parameter (the buckets; with ``zero`` >= 1 sharded over d like any replicated parameter).

No all-gather over z (A and B are not split over z: they are small) and no reduce-scatter: the frozen ``W`` posts
none. Dropout draws its mask from a generator seeded by one draw of the global torch RNG and this rank's
(in_dim, z, d) coordinates, so the ranks that share X_loc (over out_dim) draw the same mask, and activation
recomputation (which restores the global RNG) draws it again.
"""
from __future__ import annotations

from typing import Optional, TYPE_CHECKING

import torch
from torch import nn

from ..io.state_dict import add_state_hooks, deepcopy_keeping_marks
from ..spec import TileSpec
from ..nn import init as _init
from ..tensor_parallel.replicated_grad import reduce_over_z, token_grad, uses_token

if TYPE_CHECKING:
    from ..tensor_parallel.linear import Linear

#: the hashed initialisation's stream for A (B starts at zero, as PEFT's)
LORA_A_STREAM = 3


class _LoraFunction(torch.autograd.Function):
    """``x_loc [m', k/G_in]`` -> ``s · AR_in(x_loc A^T) B^T`` ``[m', n/G_out]`` (see the module docstring)."""

    @staticmethod
    def forward(ctx, x_loc: torch.Tensor, A: torch.Tensor, B: torch.Tensor,  # type: ignore[override]
                adapter: "LoraAdapter", uses: Optional[torch.Tensor] = None) -> torch.Tensor:
        comm, sh = adapter.grid.comm, adapter.sharding
        dev = x_loc.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x_loc.dtype
        with torch.autocast(dev, enabled=False):
            x, a, b = x_loc.to(dt), A.to(dt), B.to(dt)
            h = comm.all_reduce(x @ a.t(), sh.in_dim)                  # [m', r]
            y = (h @ b.t()).mul_(adapter.scale)                         # [m', n/G_out]
        ctx.adapter, ctx.dt = adapter, dt
        ctx.save_for_backward(x, a, b, h)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        adapter: LoraAdapter = ctx.adapter
        grid, sh, s = adapter.grid, adapter.sharding, adapter.scale
        x, a, b, h = ctx.saved_tensors
        need_x, need_a, need_b = ctx.needs_input_grad[:3]
        dy = dy.to(ctx.dt)
        dx = da = db = None
        if need_x or need_a:
            dh = grid.comm.all_reduce((dy @ b).mul_(s), sh.out_dim)    # [m', r]: summed over the output features
            if need_x:
                dx = dh @ a                                             # [m', k/G_in]
            if need_a:
                da = dh.t() @ x                                         # [r, k/G_in], partial over z (tokens)
        if need_b:
            db = (dy.t() @ h).mul_(s)                                   # [n/G_out, r], partial over z (tokens)
        params = [p for p, g in ((adapter.A, da), (adapter.B, db)) if g is not None]
        grads = [g.to(grid.runtime.grad_dtype(p)) for p, g in ((adapter.A, da), (adapter.B, db)) if g is not None]
        reduced = iter(reduce_over_z(grid, params, grads) if params else [])
        da = next(reduced) if da is not None else None
        db = next(reduced) if db is not None else None
        da = None if da is None else da.to(adapter.A.dtype)
        db = None if db is None else db.to(adapter.B.dtype)
        return dx, da, db, None, token_grad(ctx, 4, dy)


class LoraAdapter(nn.Module):
    """The adapter of one parallel ``Linear`` (``base``): ``A [r, k/G_in]``, ``B [n/G_out, r]`` in its layout.

    ``forward(x_loc [m', k/G_in]) -> [m', n/G_out]``, added to the base layer's ``y_loc`` by ``Linear.forward``.
    ``A`` starts as the hashed uniform init with PEFT's bound ``1/sqrt(k)`` (kaiming-uniform with ``a=sqrt(5)``), ``B``
    at zero, so a fresh adapter leaves the model's output unchanged. A bf16/fp16 base gets fp32 adapters (PEFT's
    ``autocast_adapter_dtype``); the adapter path computes in the input's (or autocast's) dtype. The tiles tell checkpoints and exports the dense
    ``[r, k]`` and ``[n, r]`` (a fused layer's B rows carry its row map)."""

    def __init__(self, base: "Linear", r: int, alpha: float, dropout: float = 0.0,
                 seed: Optional[int] = None) -> None:
        super().__init__()
        sh = base.sharding
        self.grid, self.sharding = base.grid, sh
        self.r, self.alpha, self.dropout = r, alpha, dropout
        self.scale = alpha / r
        self.seed = base.runtime.seeds.next() if seed is None else seed
        dtype, device = base.weight.dtype, base.weight.device
        if dtype in (torch.bfloat16, torch.float16):    # as PEFT's autocast_adapter_dtype: the adapters train in fp32
            dtype = torch.float32
        self.A = nn.Parameter(torch.empty(r, sh.k_blk, dtype=dtype, device=device))
        self.A.axgrid_tile = TileSpec((r, base.in_features), (0, sh.col0), (r, sh.k_blk))
        self.A.axgrid_replicated = sh.out_dim + "zd"
        self.B = nn.Parameter(torch.zeros(sh.n_blk, r, dtype=dtype, device=device))
        self.B.axgrid_tile = TileSpec((base.out_features, r), (sh.row0, 0), (sh.n_blk, r), row_map=sh.row_map)
        self.B.axgrid_replicated = sh.in_dim + "zd"
        if device.type != "meta":
            bound = _init.linear_bound(base.in_features)
            with torch.no_grad():
                self.A.copy_(_init.uniform_block(self.seed, LORA_A_STREAM, base.in_features, range(r),
                                                 range(sh.col0, sh.col0 + sh.k_blk), bound, torch.float64, device))
        add_state_hooks(self)

    __deepcopy__ = deepcopy_keeping_marks

    def _drop(self, x_loc: torch.Tensor) -> torch.Tensor:
        """``x_loc`` times a dropout mask shared by the ranks holding the same ``x_loc`` (over out_dim)."""
        if not self.training or self.dropout == 0.0:
            return x_loc
        g, sh = self.grid, self.sharding
        draw = int(torch.randint(0, 2 ** 31 - 1, ()))            # global RNG: in step on every rank, restored
        gen = torch.Generator(device=x_loc.device)               # by activation recomputation
        gen.manual_seed(hash((self.seed, draw, g.coord[sh.in_dim], g.coord.z, g.coord.d)) & 0x7FFFFFFFFFFF)
        keep = torch.empty_like(x_loc).bernoulli_(1.0 - self.dropout, generator=gen)
        return x_loc * keep / (1.0 - self.dropout)

    def forward(self, x_loc: torch.Tensor) -> torch.Tensor:
        return _LoraFunction.apply(self._drop(x_loc), self.A, self.B, self,
                                   uses_token(self.grid, [self.A, self.B]))

    def delta_block(self) -> torch.Tensor:
        """``s · B A`` ``[n/G_out, k/G_in]``: the adapter folded into this rank's weight block (no communication)."""
        return (self.B.detach() @ self.A.detach()) * self.scale

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, dropout={self.dropout}, A={tuple(self.A.shape)}, B={tuple(self.B.shape)}"
