"""A whole decoder-only transformer on the grid, laid out like axgrid's own GPT, with no redistribution anywhere.

A :class:`TransformerPlan` names, by qualified module name (``*`` matches one path component, e.g. the layer
index), the pieces of a model whose code we do not own (a Hugging Face model, say). :func:`apply_plan` swaps them
in place so that the model's own ``forward`` runs unchanged on this rank's pieces:

=====================  ==================================  ====================================================
piece                  tensor on this rank                 what it becomes
=====================  ==================================  ====================================================
batch inputs           ``[B/Gz, S]``                       a forward pre-hook keeps this z-rank's sequences
embedding              ``[B/Gz, S, h/Gx]``                 ``axgrid.nn.Embedding``: all rows, features over x
tied embedding         ``[B/Gz, S, h/Gx]``                 ``axgrid.nn.TiedEmbedding``: reads the head's shard
residual stream        ``[B/Gz, S, h/Gx]`` (repl. over y)  untouched (the model's own additions)
norms                  ``[B/Gz, S, h/Gx]``                 ``axgrid.nn.RMSNorm``: statistics AR_x of ``[m']``
producers (normal)     ``[B/Gz, S, n/Gy]``                 q, k, v / gate, up: rows over y in whole units
in-between             local heads / elementwise           untouched: ``view(..., -1, head_dim)`` sees H/Gy heads
head norms (q/k)       ``[B/Gz, S, H/Gy, d]``              ``axgrid.nn.HeadRMSNorm``: local; dw over y and z
consumer (transposed)  ``[B/Gz, S, h/Gx]``                 o / down: back to the stream layout
head (normal)          ``[B/Gz, S, V/Gy]``                 vocabulary over y; the loss is vocab-parallel CE
=====================  ==================================  ====================================================

So attention runs on ``H/Gy`` query heads and ``H_kv/Gy`` key/value heads (GQA groups stay whole: query head j
uses key/value head ``j // (H/H_kv)`` locally too) with no communication; rotary embeddings act per head on
whole sequences. The model's outputs are this rank's pieces (``logits [B/Gz, S, V/Gy]``; see
:func:`gather_logits`). The loss is the mean over all ``B`` sequences, the same on every rank of the x·y·z block.

Tied embeddings (the head's weight *is* the embedding's): one parameter, stored once in the head's layout
(vocabulary over y, features over x, split over z); the lookup reads it vocabulary-parallel with one all-reduce
over y (see :mod:`axgrid.tensor_parallel.tied_embedding` for the shapes and the gradient). A fused producer (Phi-3's
``qkv_proj``, ``gate_up_proj``) keeps, per rank, its share of each segment (:class:`Pair`'s ``segments``).

A model that does not fit the grid raises before anything is built, naming the size, what Gx and Gy must divide
and the grids of this size that fit; ``plan={}`` runs it drop-in instead.
"""
from __future__ import annotations

import fnmatch
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from ..core.grid import Grid
from ..tensor_parallel.embedding import Embedding
from ..tensor_parallel.rmsnorm import HeadRMSNorm, RMSNorm
from ..tensor_parallel.tied_embedding import TiedEmbedding
from ..tensor_parallel.redistribute import gather_tokens_features
from ..spec.layout import all_shapes
from .cp_attention import chunk_batch, use_context_parallel_attention
from .loss import VocabParallelCausalLMLoss
from .moe import check_blocks, use_expert_parallel
from .parallelize import LinearPlan, parallel_copy, set_submodule


@dataclass(frozen=True)
class Pair:
    """Normal ``producers`` (sharing the stream as input) feeding the transposed ``consumer`` (whose output is
    the stream) through per-token, per-unit operations. ``unit``: rows split over y only in whole units
    (``head_dim`` for attention). ``segments``: one fused producer whose rows are consecutive segments, each split
    over y on its own (Phi-3's ``qkv_proj``: ``(H·d, H_kv·d, H_kv·d)``; ``gate_up_proj``: ``(f, f)``), so that a
    rank's output is its share of every segment in turn (:class:`~axgrid.tensor_parallel.linear.Linear`'s
    ``out_segments``)."""

    producers: tuple[str, ...]
    consumer: str
    unit: int = 1
    segments: tuple[int, ...] = ()


@dataclass(frozen=True)
class TransformerPlan:
    """Names of the pieces of a decoder-only transformer (patterns: ``*`` matches one path component).

    ``embedding``: the token ``nn.Embedding``; ``norms``: RMS norms over the hidden features (``weight [h]`` and
    ``variance_epsilon`` or ``eps``); ``pairs``: every Linear of the blocks; ``head``: the ``[V, h]`` LM head
    (None for a base model), which may share its weight with the embedding (tied embeddings:
    :class:`~axgrid.tensor_parallel.tied_embedding.TiedEmbedding`); ``batch_inputs``: forward arguments whose first
    dimension is the batch, split over z by sequence before the model runs. Every ``nn.Linear`` and every module holding
    parameters must be named, and nothing else may mix hidden features, since the stream is sharded.

    Family options: ``head_norms``: RMS norms over each head's features (Qwen3's and Gemma 3's ``q_norm``,
    ``k_norm``); ``embedding_scale``: the embedding's output is multiplied by it (Gemma: ``sqrt(h)``), and an
    ``nn.Embedding`` subclass is accepted only with it; ``unit_offset_norms``: every norm scales by ``1 + w`` in
    fp32 (Gemma); ``local_heads``: modules whose forward reads the head counts (Phi-3's attention slices its fused
    ``qkv`` at ``config.num_attention_heads · d``) get this rank's counts (:class:`LocalHeadsConfig`); ``attention``:
    the attention modules (they call transformers' attention interface), whose implementation becomes axgrid's
    under context parallelism (:mod:`axgrid.plans.cp_attention`; a plan without them is refused there); ``moe``:
    mixture-of-experts blocks (transformers' ``*SparseMoeBlock``), each made expert-parallel with only this rank's
    experts (:mod:`axgrid.plans.moe`); what is inside them is theirs, not the pairs'."""

    embedding: str
    norms: tuple[str, ...]
    pairs: tuple[Pair, ...]
    head: Optional[str] = None
    head_norms: tuple[str, ...] = ()
    embedding_scale: Optional[float] = None
    unit_offset_norms: bool = False
    local_heads: tuple[str, ...] = ()
    attention: tuple[str, ...] = ()
    batch_inputs: tuple[str, ...] = ("input_ids", "attention_mask", "position_ids", "labels", "shift_labels")
    moe: tuple[str, ...] = ()
    name: str = "custom"
    notes: tuple[str, ...] = field(default=(), compare=False)


def _expand(model: nn.Module, pattern: str, kinds: tuple[type, ...], what: str) -> list[str]:
    names = [n for n, m in model.named_modules() if n and fnmatch.fnmatchcase(n, pattern)
             and n.count(".") == pattern.count(".")]
    if not names:
        raise ValueError(f"plan: {what} {pattern!r} matches no module of the model")
    bad = [n for n in names if not isinstance(model.get_submodule(n), kinds)]
    if bad:
        raise ValueError(f"plan: {what} {pattern!r} matches {bad}, which are not {[k.__name__ for k in kinds]}")
    return names


def _same_layer(pattern: str, name: str, star: str) -> str:
    """``pattern`` with its ``*`` parts taken from ``name`` matched by ``star`` (pairs inside one block)."""
    parts, sp, nparts = pattern.split("."), star.split("."), name.split(".")
    fill = [n for s, n in zip(sp, nparts) if s == "*"]
    out, i = [], 0
    for p in parts:
        if p == "*" and i < len(fill):
            out.append(fill[i])
            i += 1
        else:
            out.append(p)
    return ".".join(out)


@dataclass
class _Resolved:
    embedding: str
    norms: list[str]
    head_norms: list[str]
    linears: dict[str, LinearPlan]
    head: Optional[str]
    tied: bool
    local_heads: list[str]
    attention: list[str]
    moe: list[str] = field(default_factory=list)


#: ``(what, value, grid dimension)``: ``value`` must be divisible by G<dim>.
Constraint = tuple[str, int, str]


def _units(p: str, lin: nn.Linear, pr: Pair) -> list[Constraint]:
    """What of producer ``p`` must divide Gy: its head count (or width), per segment when fused."""
    parts = pr.segments or (lin.out_features,)
    if pr.unit > 1:
        return [(f"{p} head count ({s} rows of head_dim {pr.unit})", s // pr.unit, "y") for s in parts]
    return [(f"{p} out_features" + (f" segment ({s})" if pr.segments else ""), s, "y") for s in parts]


def resolve(model: nn.Module, grid: Grid, plan: TransformerPlan) -> _Resolved:
    """Concrete module names and Linear layouts of ``plan`` on ``model``; raises (before any collective, on every
    rank alike) a ValueError naming the module, the value and the fix when the model does not fit the grid (the
    grids of this size that fit, or ``plan={}``)."""
    moe = [n for pat in plan.moe for n in _expand(model, pat, (nn.Module,), "moe")]
    check_blocks(model, moe, grid)
    inside_moe = tuple(n + "." for n in moe)
    emb_name = _expand(model, plan.embedding, (nn.Embedding,), "embedding")
    if len(emb_name) != 1:
        raise ValueError(f"plan: embedding {plan.embedding!r} matches {emb_name}; name one module")
    emb: nn.Embedding = model.get_submodule(emb_name[0])
    if type(emb) is not nn.Embedding and plan.embedding_scale is None:
        raise ValueError(f"plan {plan.name!r}: embedding {emb_name[0]} is a {type(emb).__name__}, an nn.Embedding "
                         f"with its own forward; the plan replaces it by a plain lookup: set "
                         f"TransformerPlan.embedding_scale if it only scales the rows, else use plan={{}} (drop-in)")
    h = emb.embedding_dim
    checks: list[Constraint] = [(f"hidden size ({emb_name[0]})", h, "x")]
    norms = [n for pat in plan.norms for n in _expand(model, pat, (nn.Module,), "norm")]
    for n in norms:
        w = getattr(model.get_submodule(n), "weight", None)
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != (h,) or _eps(model.get_submodule(n)) is None:
            raise ValueError(f"plan: norm {n} is not an RMS norm over the {h} hidden features (weight [{h}] and "
                             f"variance_epsilon/eps)")
    head_norms = [n for pat in plan.head_norms for n in _expand(model, pat, (nn.Module,), "head norm")]
    for n in head_norms:
        w = getattr(model.get_submodule(n), "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 1 or _eps(model.get_submodule(n)) is None:
            raise ValueError(f"plan: head norm {n} is not an RMS norm over a head's features (weight [head_dim] "
                             f"and variance_epsilon/eps)")
    linears: dict[str, LinearPlan] = {}
    for pr in plan.pairs:
        if pr.segments and (len(pr.producers) != 1 or any(s % pr.unit for s in pr.segments)):
            raise ValueError(f"plan: pair {pr.consumer!r}: segments={pr.segments} describe ONE fused producer whose "
                             f"segments are whole units of {pr.unit}")
        for consumer in _expand(model, pr.consumer, (nn.Linear,), "consumer"):
            producers = [_same_layer(p, consumer, pr.consumer) for p in pr.producers]
            for p in producers:
                _expand(model, p, (nn.Linear,), "producer")
                lin = model.get_submodule(p)
                if lin.out_features % pr.unit or lin.in_features != h or (
                        pr.segments and sum(pr.segments) != lin.out_features):
                    raise ValueError(f"plan: {p} maps {lin.in_features} -> {lin.out_features} features; a producer "
                                     f"takes the {h} hidden features and gives whole units of {pr.unit}"
                                     + (f" in segments {pr.segments}" if pr.segments else ""))
                checks += [(f"{p}.in_features", lin.in_features, "x")] + _units(p, lin, pr)
                linears[p] = LinearPlan(False, "sharded", "sharded", unit=pr.unit, segments=pr.segments)
            lin = model.get_submodule(consumer)
            if lin.out_features != h or lin.in_features % pr.unit:
                raise ValueError(f"plan: {consumer} maps {lin.in_features} -> {lin.out_features} features; a "
                                 f"consumer gives the {h} hidden features from whole units of {pr.unit}")
            what = f"{consumer} head count ({lin.in_features} columns of head_dim {pr.unit})" if pr.unit > 1 \
                else f"{consumer}.in_features"
            checks += [(f"{consumer}.out_features", lin.out_features, "x"), (what, lin.in_features // pr.unit, "y")]
            linears[consumer] = LinearPlan(True, "sharded", "sharded", after=tuple(producers), unit=pr.unit)
    head, tied = None, False
    if plan.head is not None:
        (head,) = _expand(model, plan.head, (nn.Linear,), "head")
        lin = model.get_submodule(head)
        tied = lin.weight is emb.weight
        if tied and lin.bias is not None:
            raise ValueError(f"plan: {head} is tied to {emb_name[0]} and has a bias, which a tied head cannot "
                             f"carry; use plan={{}} (drop-in)")
        checks.append((f"{head} vocabulary", lin.out_features, "y"))
        linears[head] = LinearPlan(False, "sharded", "sharded")
    others = sorted(n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in linears
                    and not n.startswith(inside_moe))
    if others:
        raise ValueError(f"plan {plan.name!r}: Linear modules {others} are not in the plan; the stream is sharded, "
                         f"so every Linear must be a producer, consumer or the head")
    placed = {emb_name[0], *norms, *head_norms, *linears}
    loose = [n for n, m in model.named_modules() if n not in placed and not n.startswith(inside_moe)
             and any(p is not None for p in m._parameters.values())]
    if loose:
        raise ValueError(f"plan {plan.name!r}: {loose[:4]} hold parameters the plan does not place; the stream is "
                         f"sharded, so a norm over the hidden features goes in norms and one over each head's "
                         f"features in head_norms (or use plan={{}}: drop-in)")
    local_heads = [n for pat in plan.local_heads for n in _expand(model, pat, (nn.Module,), "local_heads")]
    attention = [n for pat in plan.attention for n in _expand(model, pat, (nn.Module,), "attention")]
    _check_fits(plan, checks, grid)
    return _Resolved(emb_name[0], norms, head_norms, linears, head, tied, local_heads, attention, moe)


def _check_fits(plan: TransformerPlan, checks: list[Constraint], grid: Grid) -> None:
    """Raise, naming the first size that does not divide and the grids of this size that fit."""
    for what, value, dim in checks:
        g = grid.size(dim)
        if value % g == 0:
            continue
        gcd = {d: math.gcd(*[v for _, v, dd in checks if dd == d] or [1]) for d in "xy"}
        fit = [str(s) for s in all_shapes(grid.world_size) if gcd["x"] % s.gx == 0 and gcd["y"] % s.gy == 0]
        shown = ", ".join(fit[:8]) + (f" and {len(fit) - 8} more" if len(fit) > 8 else "")
        raise ValueError(f"plan {plan.name!r}: {what}={value} is not divisible by G{dim}={g} of grid {grid.shape}; "
                         f"Gx must divide {gcd['x']} and Gy must divide {gcd['y']}: grids of {grid.world_size} "
                         f"ranks that fit: {shown or 'none'} (or plan={{}}: drop-in)")


def _eps(norm: nn.Module) -> Optional[float]:
    for attr in ("variance_epsilon", "eps"):
        v = getattr(norm, attr, None)
        if isinstance(v, float):
            return v
    return None


class LocalHeadsConfig:
    """A read-through view of a model config in which ``num_attention_heads`` and ``num_key_value_heads`` are
    this rank's (the model's divided by Gy), for a module whose forward reads them (Phi-3's attention cuts its
    fused ``qkv`` at ``config.num_attention_heads · head_dim``). Everything else, and every write, goes to the
    model's own config, so later changes (the attention implementation, say) still reach the module."""

    _LOCAL = ("num_attention_heads", "num_key_value_heads")

    def __init__(self, config: Any, gy: int) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_gy", gy)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_config", "_gy"):
            raise AttributeError(name)
        value = getattr(self._config, name)
        return value // self._gy if name in self._LOCAL else value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._config, name, value)


def _localize_heads(module: nn.Module, gy: int) -> None:
    for attr in ("num_heads", "num_attention_heads", "num_key_value_heads"):
        v = getattr(module, attr, None)
        if isinstance(v, int) and not isinstance(v, bool):
            setattr(module, attr, v // gy)
    if getattr(module, "config", None) is not None and not isinstance(module.config, LocalHeadsConfig):
        module.config = LocalHeadsConfig(module.config, gy)


def apply_plan(model: nn.Module, grid: Grid, plan: TransformerPlan) -> nn.Module:
    """Swap ``model``'s pieces in place as the module docstring says; returns the model. Under context
    parallelism (``cp`` dividing Gz) attention runs through :mod:`axgrid.plans.cp_attention`."""
    cp, gz = grid.size("c"), grid.size("z")
    if gz % cp:
        raise ValueError(f"axgrid plan on grid {grid.shape} with cp={cp}: a plan splits sequences over z only, so cp "
                         f"must divide Gz={gz}; choose cp in {[c for c in range(1, gz + 1) if gz % c == 0]}")
    r = resolve(model, grid, plan)
    if r.moe and cp > 1:
        raise ValueError(f"axgrid plan {plan.name!r}: mixture-of-experts blocks under context parallelism (cp={cp}) "
                         f"are not supported; use cp=1")
    emb = model.get_submodule(r.embedding)
    made = {n: parallel_copy(model.get_submodule(n), grid, p) for n, p in r.linears.items()}
    for n, layer in made.items():
        set_submodule(model, n, layer)
    if r.tied:
        set_submodule(model, r.embedding, TiedEmbedding(made[r.head], emb.padding_idx, plan.embedding_scale))
    else:
        set_submodule(model, r.embedding, Embedding.from_dense(emb, grid, "x", scale=plan.embedding_scale))
    for n in r.norms:
        norm = model.get_submodule(n)
        set_submodule(model, n, RMSNorm.from_dense(norm.weight, _eps(norm), grid, "x", plan.unit_offset_norms))
    for n in r.head_norms:
        norm = model.get_submodule(n)
        set_submodule(model, n, HeadRMSNorm.from_dense(norm.weight, _eps(norm), grid, plan.unit_offset_norms))
    for n in r.local_heads:
        _localize_heads(model.get_submodule(n), grid.size("y"))
    use_expert_parallel(model, r.moe, grid)
    if grid.size("c") > 1:
        use_context_parallel_attention(model, [model.get_submodule(n) for n in r.attention], grid)
    model.register_forward_pre_hook(_BatchSplit(grid, plan.batch_inputs, type(model).forward), with_kwargs=True)
    if r.head is not None and _has_loss_setter(model):
        model.loss_function = VocabParallelCausalLMLoss(grid)
    model.axgrid_plan = plan
    return model


def _has_loss_setter(model: nn.Module) -> bool:
    prop = getattr(type(model), "loss_function", None)
    return isinstance(prop, property) and prop.fset is not None


class _BatchSplit:
    """Forward pre-hook: keep this z-rank's sequences ``[z·B/Gz, (z+1)·B/Gz)`` of every batch input."""

    def __init__(self, grid: Grid, names: tuple[str, ...], forward: Any) -> None:
        self.grid, self.names = grid, names
        params = list(inspect.signature(forward).parameters)
        self.positional = params[1:] if params and params[0] == "self" else params

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = dict(kwargs)
        for name, value in zip(self.positional, args):
            kwargs[name] = value
        args = args[len(self.positional):]
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("axgrid plan: inputs_embeds is not supported (the embedding is sharded); pass input_ids")
        ids = kwargs.get("input_ids")
        if ids is None:
            raise ValueError("axgrid plan: the model needs input_ids [batch, seq]")
        cp = self.grid.size("c")
        gz = self.grid.size("z") // cp                   # groups of cp z-ranks share their sequences
        b = ids.shape[0]
        if ids.dim() != 2 or b % gz:
            over = f"Gz={gz}" if cp == 1 else f"Gz/cp={gz} (groups of cp={cp} z-ranks)"
            raise ValueError(f"axgrid plan: input_ids of shape {tuple(ids.shape)}: a [batch, seq] batch whose "
                             f"{b} sequences divide over {over} (attention needs whole sequences); use a batch "
                             f"per data-parallel rank that is a multiple of {gz}")
        if cp > 1:
            g = self.grid.index("z") // cp
            return args, chunk_batch(kwargs, self.grid, slice(g * (b // gz), (g + 1) * (b // gz)), b)
        if gz > 1:
            rows = slice(self.grid.index("z") * (b // gz), (self.grid.index("z") + 1) * (b // gz))
            for name in self.names:
                v = kwargs.get(name)
                if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == b:
                    kwargs[name] = v[rows]
        return args, kwargs


def gather_logits(logits: torch.Tensor, grid: Grid) -> torch.Tensor:
    """This rank's ``logits [B/Gz, S, V/Gy]`` -> the whole ``[B, S, V]`` on every rank of the block (collective
    over y and z; differentiable)."""
    b, s, v = logits.shape
    full = gather_tokens_features(logits.reshape(b * s, v), grid, "y", b * s * grid.size("z"))
    return full.reshape(b * grid.size("z"), s, v * grid.size("y"))
