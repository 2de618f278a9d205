"""``axgrid.nn.TiedEmbedding``: the token lookup of tied embeddings, reading the LM head's sharded weight.

Tied embeddings use one matrix ``E [V, h]`` twice: the lookup ``x_t = E[id_t]`` and the head ``logits = x Eᵀ``. Today's
two layouts disagree: :class:`~axgrid.tensor_parallel.embedding.Embedding` keeps all ``V`` rows with the features over x
(``[V, h/Gx]``, replicated over y, z and d), while the head, a normal :class:`~axgrid.tensor_parallel.linear.Linear`,
splits the vocabulary over y and the features over x and stores 1/Gz of its block. ``E`` is stored once, in the head's
layout:

==========  =================================================  ==========================================
tensor      on this rank                                       notes
==========  =================================================  ==========================================
E (stored)  ``shard [ceil(V·h/(Gx·Gy·Gz))]``                   the head's weight: block flattened, over z
E block     ``W_blk = AG_z(shard)   [V/Gy, h/Gx]``             rows ``v0 = y·V/Gy ..``, cols ``x·h/Gx ..``
ids         ``[m']``                                           this rank's tokens, the same over x and y
partial     ``P[t] = W_blk[id_t - v0]`` if ``v0 <= id_t < v0 + V/Gy`` else 0    ``[m', h/Gx]``
output      ``X = AR_y(P)   [m', h/Gx]``                       exactly one y-rank holds each token's row:
                                                               the residual stream's layout
==========  =================================================  ==========================================

Backward: the stream's gradient ``dX [m', h/Gx]`` is the same on every y-rank (every layer all-reduces its input
gradient over y), so AR_y's backward is the identity and
``dW_blk[r] = sum_{t: id_t = v0 + r} dX[t]`` (``[V/Gy, h/Gx]``, this rank's tokens: partial over z), then
``RS_z`` gives the shard's gradient. The head's backward reduce-scatters its own ``dW_blk = dlogitsᵀ X``; autograd
adds the two into the one parameter's ``.grad``: ``dE = dE_lookup + dE_head``, exactly the dense model's. The
parameter is marked ``axgrid_shared``, so the overlapped gradient pipeline (ORS) hands both reduce-scatters back to
autograd instead of writing ``.grad`` itself: the data-parallel reduction (ODP) then sees the sum once.

Cost against the untied twin (embedding ``[V, h/Gx]`` per rank, head ``[V·h/(Gx·Gy·Gz)]``): the table is gone
(``V·h/Gx`` fewer elements per rank, which is at least the head's size: no rank holds a dense copy); per
micro-batch the lookup adds a forward ``AG_z`` of the block (``V·h/(Gx·Gy)``) and ``AR_y`` of ``[m', h/Gx]``, and
a backward ``RS_z`` of the block, in place of the untied table's backward ``AR_z`` of ``[V, h/Gx]``.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..device import host_read
from ..io.state_dict import add_state_hooks, deepcopy_keeping_marks
from .embedding import scale_value
from .linear import Linear


class _TiedLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, layer: Any) -> torch.Tensor:  # type: ignore[override]
        head = layer.head
        grid, sh = head.grid, head.sharding
        block = head.runtime.weights.gather(head, weight)                      # [V/Gy, h/Gx]
        local = ids - sh.row0
        inside = (local >= 0) & (local < sh.n_blk)
        part = block.index_select(0, torch.where(inside, local, torch.zeros_like(local)))
        part = part * inside.unsqueeze(-1).to(part.dtype)                       # [m', h/Gx]
        ctx.layer = layer
        ctx.save_for_backward(local, inside)
        if grid.size("y") == 1:
            return part
        compute = head.runtime.weights.compute_dtype(part)
        if compute is not None:     # Gz = 1 under autocast: the block is the fp32 parameter itself, not a gathered
            # copy in the compute dtype; all-reduce in that dtype as when gathered (the same values, half the bytes)
            return grid.comm.all_reduce(part.to(compute), "y").to(part.dtype)
        return grid.comm.all_reduce(part, "y")

    @staticmethod
    def backward(ctx, dx: torch.Tensor):  # type: ignore[override]
        layer: TiedEmbedding = ctx.layer
        head, w = layer.head, layer.weight
        sh = head.sharding
        local, inside = ctx.saved_tensors
        grad = torch.zeros((sh.n_blk, sh.k_blk), dtype=torch.float32, device=dx.device)
        # rows of other ranks add zeros to row 0: no boolean indexing, whose output size the host must read (a
        # device synchronisation on a GPU; on fake tensors a size that cannot be known)
        grad.index_add_(0, torch.where(inside, local, torch.zeros_like(local)),
                        dx.float() * inside.unsqueeze(-1).to(torch.float32))
        pad = layer.padding_idx
        if pad is not None and sh.row0 <= pad < sh.row0 + sh.n_blk:
            grad[pad - sh.row0] = 0          # like nn.Embedding: the lookup never trains the padding row
        flat = grad.reshape(-1).to(w.dtype)
        if sh.padded_numel != sh.block_numel:
            flat = torch.cat([flat, flat.new_zeros(sh.padded_numel - sh.block_numel)])
        return None, head.runtime.grads.reduce_scatter(w, flat), None


class TiedEmbedding(nn.Module):
    """The input embedding tied to ``head`` (a normal ``axgrid.nn.Linear [V, h]`` with a sharded input: the LM
    head), reading its weight; see the module docstring.

    Forward: integer ids ``[...]`` (this rank's sequences) -> ``[..., h/Gx]``, times ``scale`` when given (Gemma's
    ``sqrt(h)``, cast to the weight's dtype first, as Hugging Face does). ``weight`` is the head's Parameter itself,
    so the model's state dict lists it under both names, as a tied Hugging Face model does.
    """

    def __init__(self, head: Linear, padding_idx: Optional[int] = None, scale: Optional[float] = None) -> None:
        super().__init__()
        if head.transpose or head.input_layout != "sharded" or head.sharding.row_map:
            raise ValueError("TiedEmbedding reads a normal, unfused axgrid.nn.Linear head with a sharded input "
                             "(vocabulary over y, features over x)")
        self.__dict__["head"] = head              # a plain reference: the head stays the model's own submodule
        self.weight = head.weight
        self.weight.axgrid_shared = True          # two layers reduce its gradient: see the module docstring
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        if padding_idx is not None and not -self.num_embeddings <= padding_idx < self.num_embeddings:
            raise ValueError(f"padding_idx={padding_idx} is outside the table's {self.num_embeddings} rows")
        self.padding_idx = None if padding_idx is None else padding_idx % self.num_embeddings
        self.scale = scale
        add_state_hooks(self)

    __deepcopy__ = deepcopy_keeping_marks     # the copy keeps its TileSpec and reads the copied head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"embedding ids must be int64 or int32, got {ids.dtype}")
        flat = ids.reshape(-1).long()
        if flat.numel():
            lo, hi = host_read(torch.stack([flat.min(), flat.max()]))     # one intended read of the device
            if lo < 0 or hi >= self.num_embeddings:
                raise IndexError(f"token ids in [{lo}, {hi}] are outside the vocabulary [0, {self.num_embeddings})")
        out = _TiedLookup.apply(flat, self.weight, self)
        if self.scale is not None:
            out = out * scale_value(self.scale, self.weight.dtype)
        return out.reshape(*ids.shape, self.head.sharding.k_blk)

    def extra_repr(self) -> str:
        h = self.head
        return (f"num={self.num_embeddings}, dim={self.embedding_dim}, tied to the head's weight (vocabulary over y, "
                f"features over x, grid {h.grid.shape})" + (f", scale={self.scale:g}" if self.scale else ""))
