"""A GPT (pre-norm decoder-only transformer) whose every FC layer is Agarwal's 3D parallel matmul on the grid.

``GPT(config, grid)`` builds the parallel model; ``GPT(config, None)`` builds the serial reference with identical
weights (every parameter is a hashed function of ``(config.seed, parameter name, global index)``, so any grid and
the serial model hold the same dense values).

Data. ``model(tokens, targets)`` takes this data-parallel rank's sequences ``[B_d, S]`` (the same on every rank of
its x·y·z block; rank ``d`` of ``Gd`` usually holds sequences ``[d·B/Gd, (d+1)·B/Gd)`` of the global batch).
Attention needs whole sequences on one rank, so the z split is by sequence: z-rank ``z`` keeps sequences
``[z·b, (z+1)·b)`` with ``b = B_d / Gz`` (``B_d`` must be divisible by ``Gz``; checked before any collective).

Context parallelism (``axgrid.init(..., cp=N)`` with ``N`` dividing Gz): the z-ranks form ``Gz/N`` groups of ``N``
consecutive ones; group ``g = z // N`` keeps sequences ``[g·b, (g+1)·b)`` with ``b = B_d·N / Gz``, and each of its
ranks keeps two chunks of each (:mod:`axgrid.context_parallel.chunks`: ``2c = S / N`` tokens at their own positions);
attention exchanges keys and values over the group (all-gathered or around a ring, ``GPTConfig.cp_exchange``;
:mod:`axgrid.context_parallel`). The loss's sum over z and the gradients' sums over z (RS_z, AR_z) already add
every token once, so nothing else changes.

Layout of one rank (``m' = b·S`` tokens, ``h`` hidden, ``H`` heads, ``V`` vocabulary, ``f`` MLP width):

=====================  ===============================  ============================================================
step                   tensor on this rank               communication
=====================  ===============================  ============================================================
token + pos embedding  ``[m', h/Gx]`` (repl. over y)     none (tables hold all rows, features over x)
LayerNorm              ``[m', h/Gx]``                    fwd 2 AR_x of ``[m']``; bwd AR_x ``[m',2]``, AR_z of w, b
QKV (normal)           ``[m', 3h/Gy]`` = heads over y    the Linear's (AG_z W, AR_x; bwd AR_y, RS_z)
attention              ``H/Gy`` local heads, whole seqs  none
out-proj (transposed)  ``[m', h/Gx]``                    the Linear's (AR_y fwd; AR_x bwd)
residual               ``[m', h/Gx]`` (repl. over y)     none
MLP up (normal), GELU  ``[m', f/Gy]``                    the Linear's
MLP down (transposed)  ``[m', h/Gx]``                    the Linear's
final LayerNorm        ``[m', h/Gx]``                    as above
LM head (normal)       ``[m', V/Gy]`` (repl. over x)     the Linear's: weight ``[V, h]`` split like any FC layer
cross entropy          ``[m']``                          AG_y of ``[m']`` (max), AR_y of ``[m', 2]``; none in bwd
loss                   scalar                            AR_z of one number (forward only)
=====================  ===============================  ============================================================

The head is a separate (untied) ``[V, h]`` weight: a normal ``axgrid.nn.Linear`` whose output features are the
vocabulary split over y, so no rank holds full logits and the head's weight is sharded over x, y and z like
every other FC layer (a tied head would need the embedding table in the FC layout or an ``[m', V]`` all-reduce).
The QKV weight's rows are ordered head by head (``[q_j; k_j; v_j]`` for head j), so splitting its rows over y
gives each y-rank whole heads. Dropout is not used (deterministic, and off in large pre-training runs).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from ..device import host_read
from ..core.grid import Grid
from ..tensor_parallel.embedding import Embedding
from ..nn.init import reference_linear
from ..tensor_parallel.layernorm import LayerNorm
from ..tensor_parallel.linear import Linear
from ..tensor_parallel.vocab_parallel import vocab_parallel_cross_entropy
from ..context_parallel import EXCHANGES, check_sequence, context_parallel_attention, positions, shard
from ..train import decay_groups
from ..spec import NAMED_SIZES, FCLayer, TransformerShape
from .kv_cache import KVCache, LayerKV


@dataclass(frozen=True)
class GPTConfig:
    """A :class:`GPT`: its ``shape`` (an ``axgrid.spec.TransformerShape`` of the GPT block: layers, hidden, heads,
    ``seq`` the position table's rows, vocab, the MLP width ``ffn``, ``bias`` on every FC layer but the head, name)
    and the runtime's knobs, which are not shape: ``recompute``: run each block under ``torch.utils.checkpoint``
    (activations recomputed in backward); ``eps`` of the layer norms; ``seed`` of the hashed initialisation;
    ``emb_std`` of the embedding tables; ``cp_exchange``: how attention under context parallelism exchanges keys
    and values, ``"all_gather"`` or ``"ring"`` (:mod:`axgrid.context_parallel`; the same result within round-off).
    """

    shape: TransformerShape
    recompute: bool = False
    eps: float = 1e-5
    seed: int = 0
    emb_std: float = 0.02
    cp_exchange: str = "all_gather"

    def __post_init__(self) -> None:
        if self.cp_exchange not in EXCHANGES:
            raise ValueError(f"GPTConfig.cp_exchange={self.cp_exchange!r}: choose one of {list(EXCHANGES)}")
        if not isinstance(self.shape, TransformerShape) or not self.shape.is_gpt:
            raise ValueError(f"GPTConfig.shape={self.shape!r} must be a TransformerShape of family 'gpt' (e.g. "
                             f"TransformerShape.named('gpt-tiny')); a Hugging Face decoder is built from its config")

    @staticmethod
    def names() -> list[str]:
        return list(NAMED_SIZES)

    @staticmethod
    def named(name: str, **changes: Any) -> "GPTConfig":
        """The named size (``gpt-tiny``, ``gpt-mini``, ``gpt-5b`` ... ``gpt-640b``) with ``changes`` to its shape's
        fields (``TransformerShape.named``) and to the runtime's knobs."""
        knobs = {f.name for f in fields(GPTConfig)} - {"shape"}
        shape = TransformerShape.named(name, **{k: v for k, v in changes.items() if k not in knobs})
        return GPTConfig(shape, **{k: v for k, v in changes.items() if k in knobs})

    def flops_per_iteration(self, batch: int, seq: Optional[int] = None, recompute: Optional[bool] = None) -> float:
        """FLOPs of one training iteration on ``batch`` sequences (``TransformerShape.flops_per_iteration``), with
        this config's ``recompute`` unless given."""
        return self.shape.flops_per_iteration(batch, self.recompute if recompute is None else recompute, seq)

    def check_grid(self, grid: Grid) -> None:
        """Raise a ValueError naming the value and the fix when this model does not fit ``grid``
        (``TransformerShape.grid_rules``)."""
        for what, value, dim in self.shape.grid_rules():
            g = grid.size(dim)
            if value % g:
                raise ValueError(f"GPT {self.shape.name}: {what}={value} is not divisible by G{dim}={g} of grid "
                                 f"{grid.shape}; choose a grid whose G{dim} divides {value} (or change {what})")
        cp, gz = grid.size("c"), grid.size("z")
        if gz % cp:
            raise ValueError(f"GPT on grid {grid.shape} with cp={cp}: the GPT splits sequences over z only, so cp "
                             f"must divide Gz={gz}; choose cp in {[c for c in range(1, gz + 1) if gz % c == 0]}")


def param_seed(seed: int, name: str) -> int:
    """The initialisation seed of the parameter (module) ``name``: the same on every rank, grid and serial."""
    h = hashlib.sha256(f"axgrid-gpt:{seed}:{name}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def _fc(cfg: GPTConfig, grid: Optional[Grid], name: str, layer: FCLayer, init: bool = True) -> nn.Module:
    """``layer`` as a dense ``nn.Linear`` (serial) or a sharded-layout ``axgrid.nn.Linear`` with the same values."""
    seed = param_seed(cfg.seed, name)
    if grid is None:
        if not init:                             # parameters left empty (made on meta, then allocated)
            lin = nn.Linear(layer.k, layer.n, bias=layer.bias, device="meta")
            lin.weight = nn.Parameter(torch.empty(layer.n, layer.k))
            if layer.bias:
                lin.bias = nn.Parameter(torch.empty(layer.n))
            return lin
        return reference_linear(layer.k, layer.n, layer.bias, seed)
    return Linear(layer.k, layer.n, layer.bias, transpose=layer.transposed, grid=grid, seed=seed,
                  input_layout="sharded", output_layout="sharded", init=init)


class _SumOverZ(torch.autograd.Function):
    """Sum a scalar over z in forward; identity in backward (each z-rank's part of the sum is its own)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, grid: Grid) -> torch.Tensor:  # type: ignore[override]
        return grid.comm.all_reduce(t.detach().reshape(1).clone(), "z")[0]

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return g, None


class Block(nn.Module):
    """Pre-norm transformer block: ``x + proj(attn(qkv(ln1(x))))``, then ``x + down(gelu(up(ln2(x))))``.

    Forward: ``x [b·S, h_loc]`` (rows sequence-major) -> same shape; ``h_loc = h/Gx`` on a grid, ``h`` serial.
    """

    def __init__(self, cfg: GPTConfig, grid: Optional[Grid], prefix: str, init: bool = True) -> None:
        super().__init__()
        shape = cfg.shape
        h = shape.hidden
        fc = {layer.name: layer for layer in shape.block_layers()}   # see axgrid.spec.layers
        self.heads_local = shape.heads // (grid.size("y") if grid is not None else 1)
        self.grid, self.cp_exchange = grid, cfg.cp_exchange
        self.head_dim = shape.head_dim
        self.ln1 = LayerNorm(h, grid, eps=cfg.eps)
        self.qkv = _fc(cfg, grid, prefix + "qkv", fc["qkv"], init)
        self.proj = _fc(cfg, grid, prefix + "proj", fc["proj"], init)
        self.ln2 = LayerNorm(h, grid, eps=cfg.eps)
        self.up = _fc(cfg, grid, prefix + "up", fc["up"], init)
        self.down = _fc(cfg, grid, prefix + "down", fc["down"], init)

    def forward(self, x: torch.Tensor, b: int, s: int, kv: Optional[LayerKV] = None) -> torch.Tensor:
        """``kv``: this layer's cache (incremental decoding): the ``s`` new tokens attend to every cached one."""
        hl, dh = self.heads_local, self.head_dim
        qkv = self.qkv(self.ln1(x)).view(b, s, hl, 3, dh)             # [b, S, H_loc, 3, d]
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))  # [b, H_loc, S, d] each
        if kv is not None:
            k, v = kv.append(k, v)                                     # [b, H_loc, T, d]: T = cached + S
        t = k.shape[2]
        if self.grid is not None and self.grid.size("c") > 1:
            att = context_parallel_attention(q, k, v, self.grid.comm, exchange=self.cp_exchange)  # S = s·cp
        elif t == s:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, H_loc, S, d]
        else:   # new token i sits at position t - s + i: it sees keys 0 .. t - s + i
            mask = torch.ones(s, t, dtype=torch.bool, device=q.device).tril(t - s)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        att = att.transpose(1, 2).reshape(b * s, hl * dh)              # [m', h/Gy]
        x = x + self.proj(att)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    """A GPT on the grid (``grid``) or serial (``grid=None``) with the same weights; see the module docstring.

    ``forward(tokens [B_d, S], targets [B_d, S] | None, loss_mask [B_d, S] | None, normalizer=None, cache=None)``
    (``cache``: a :class:`~axgrid.models.kv_cache.KVCache` of this rank's sequences and heads; the tokens then
    continue the cached ones, at positions ``cache.length ..``; see :func:`axgrid.generate`):

    - without ``targets``: this rank's logits ``[B_d/Gz, S, V/Gy]`` (serial: ``[B, S, V]``; under context
      parallelism ``[B_d·cp/Gz, S/cp, V/Gy]``, its two chunks of each sequence);
    - with ``targets``: the scalar loss ``sum(per-token CE · loss_mask) / normalizer`` over all ``B_d`` sequences
      (summed over z), the same on every rank of the x·y·z block. ``normalizer`` defaults to the number of kept
      tokens of ``tokens`` (a mean); pass a global count (e.g. kept tokens of the whole step / Gd) to average over
      data-parallel ranks and micro-batches correctly after :func:`axgrid.sync_gradients` (which means over d).

    ``init=False`` leaves the weights and tables uninitialised (``torch.empty``): for a loader that fills
    them, or a dry run (:mod:`axgrid.dryrun`), whose tensors hold no values.
    """

    def __init__(self, config: GPTConfig, grid: Optional[Grid] = None, init: bool = True) -> None:
        super().__init__()
        if grid is not None:
            config.check_grid(grid)
        self.config, self.grid = config, grid
        cfg, shape = config, config.shape
        self.wte = Embedding(shape.vocab, shape.hidden, grid, seed=param_seed(cfg.seed, "wte"), std=cfg.emb_std,
                             init=init)
        self.wpe = Embedding(shape.seq, shape.hidden, grid, seed=param_seed(cfg.seed, "wpe"), std=cfg.emb_std,
                             init=init)
        self.blocks = nn.ModuleList(Block(cfg, grid, f"blocks.{i}.", init) for i in range(shape.layers))
        self.ln_f = LayerNorm(shape.hidden, grid, eps=cfg.eps)
        self.head = _fc(cfg, grid, "head", shape.head_layer(), init)

    # -- data split -----------------------------------------------------------------------------------
    def check_batch(self, tokens: torch.Tensor, start: int = 0) -> None:
        """Raise (before any collective) when ``tokens`` cannot be this model's input on this grid (``start``:
        the position of its first token, i.e. tokens already cached)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
        b, s = tokens.shape
        seq = self.config.shape.seq
        if start + s > seq:
            raise ValueError(f"sequence length {start + s} exceeds the model's seq={seq} (position table rows); use "
                             f"sequences of at most {seq} tokens or a larger seq")
        gz = 1 if self.grid is None else self.grid.size("z")
        cp = 1 if self.grid is None else self.grid.size("c")
        if cp > 1:
            check_sequence(s, cp)
        groups = gz // cp
        if b == 0 or b % groups:
            raise ValueError(f"this rank's batch of {b} sequences is not divisible by Gz={gz} (grid "
                             f"{self.grid.shape if self.grid else '-'}"
                             f"{f', cp={cp}: {groups} groups of sequences' if cp > 1 else ''}): attention needs "
                             f"whole sequences, so z splits by sequence; use a batch per data-parallel rank that is "
                             f"a multiple of {groups}")

    def local_rows(self, batch: int) -> slice:
        """The sequences of a ``[batch, S]`` input that this rank's z coordinate computes (under context
        parallelism: its group of ``cp`` z-ranks, of which it computes two chunks, :meth:`local_tokens`)."""
        if self.grid is None:
            return slice(0, batch)
        cp = self.grid.size("c")
        b = batch * cp // self.grid.size("z")
        g = self.grid.index("z") // cp
        return slice(g * b, (g + 1) * b)

    def local_tokens(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's part of ``t [batch, S]`` (tokens, targets, a loss mask): its sequences (:meth:`local_rows`)
        and, under context parallelism, its two chunks of each, ``[b, S/cp]``."""
        t = t[self.local_rows(t.shape[0])]
        if self.grid is None or self.grid.size("c") == 1:
            return t
        return shard(t, self.grid.size("c"), self.grid.index("c"), dim=1)

    # -- forward ---------------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None,
                loss_mask: Optional[torch.Tensor] = None, *, normalizer: Optional[float] = None,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        start = 0 if cache is None else cache.length
        if cache is not None and self.grid is not None and self.grid.size("c") > 1:
            raise ValueError(f"generation (a KV cache) under context parallelism (cp={self.grid.size('c')}) is not "
                             f"supported; generate on a grid built with cp=1 (a checkpoint loads onto any grid)")
        self.check_batch(tokens, start)
        if cache is not None and len(cache.layers) != len(self.blocks):
            raise ValueError(f"cache has {len(cache.layers)} layers, the model {len(self.blocks)}; use "
                             f"KVCache({len(self.blocks)})")
        for name, t in (("targets", targets), ("loss_mask", loss_mask)):
            if t is not None and t.shape != tokens.shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected the tokens' {tuple(tokens.shape)}")
        batch, seq = tokens.shape
        tok = self.local_tokens(tokens)                                # [b, s]: s = S/cp
        b, s = tok.shape
        if self.grid is not None and self.grid.size("c") > 1:
            pos = positions(seq, self.grid.size("c"), self.grid.index("c"), tok.device).repeat(b)
        else:
            pos = torch.arange(start, start + s, device=tok.device).repeat(b)
        x = self.wte(tok.reshape(-1)) + self.wpe(pos)                 # [b·s, h_loc]
        for i, block in enumerate(self.blocks):
            kv = None if cache is None else cache.layers[i]
            if self.config.recompute and torch.is_grad_enabled():
                x = checkpoint(block, x, b, s, kv, use_reentrant=False)
            else:
                x = block(x, b, s, kv)
        logits = self.head(self.ln_f(x))                               # [b·S, V_loc]
        if targets is None:
            return logits.view(b, s, -1)
        per_token = vocab_parallel_cross_entropy(logits, self.local_tokens(targets).reshape(-1), self.grid)  # fp32
        if loss_mask is not None:
            per_token = per_token * self.local_tokens(loss_mask).reshape(-1).to(per_token.dtype)
        total = per_token.sum()
        if self.grid is not None and self.grid.size("z") > 1:
            total = _SumOverZ.apply(total, self.grid)
        if normalizer is None:
            normalizer = host_read(loss_mask.sum()) if loss_mask is not None else float(batch * seq)
        return total / max(float(normalizer), 1.0)

    # -- helpers ---------------------------------------------------------------------------------------
    def optimizer_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """AdamW parameter groups: decay on FC weights and embedding tables, none on biases and norms."""
        return decay_groups(self, weight_decay)

    def flops_per_iteration(self, batch: int, seq: Optional[int] = None) -> float:
        return self.config.flops_per_iteration(batch, seq)

    def extra_repr(self) -> str:
        c = self.config.shape
        where = "serial" if self.grid is None else f"grid {self.grid.shape}"
        return (f"{c.name}: layers={c.layers}, hidden={c.hidden}, heads={c.heads}, seq={c.seq}, vocab={c.vocab}, "
                f"ffn={c.ffn}, params={c.params:,}, {where}")


__all__ = ["GPT", "GPTConfig", "Block", "param_seed"]
