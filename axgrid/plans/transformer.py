"""A whole decoder-only transformer on the grid, laid out like axgrid's own GPT, with no redistribution anywhere.

A :class:`TransformerPlan` names, by qualified module name (``*`` matches one path component, e.g. the layer
index), the pieces of a model whose code we do not own (a Hugging Face model, say). :func:`apply_plan` swaps them
in place so that the model's own ``forward`` runs unchanged on this rank's pieces:

=====================  ==================================  ====================================================
piece                  tensor on this rank                 what it becomes
=====================  ==================================  ====================================================
batch inputs           ``[B/Gz, S]``                       a forward pre-hook keeps this z-rank's sequences
embedding              ``[B/Gz, S, h/Gx]``                 ``axgrid.nn.Embedding``: all rows, features over x
residual stream        ``[B/Gz, S, h/Gx]`` (repl. over y)  untouched (the model's own additions)
norms                  ``[B/Gz, S, h/Gx]``                 ``axgrid.nn.RMSNorm``: statistics AR_x of ``[m']``
producers (normal)     ``[B/Gz, S, n/Gy]``                 q, k, v / gate, up: rows over y in whole units
in-between             local heads / elementwise           untouched: ``view(..., -1, head_dim)`` sees H/Gy heads
consumer (transposed)  ``[B/Gz, S, h/Gx]``                 o / down: back to the stream layout
head (normal)          ``[B/Gz, S, V/Gy]``                 vocabulary over y; the loss is vocab-parallel CE
=====================  ==================================  ====================================================

So attention runs on ``H/Gy`` query heads and ``H_kv/Gy`` key/value heads (GQA groups stay whole: query head j
uses key/value head ``j // (H/H_kv)`` locally too) with no communication; rotary embeddings act per head on
whole sequences. The model's outputs are this rank's pieces (``logits [B/Gz, S, V/Gy]``; see
:func:`gather_logits`). The loss is the mean over all ``B`` sequences, the same on every rank of the x·y·z block.
"""
from __future__ import annotations

import fnmatch
import inspect
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from ..grid import Grid
from ..nn.embedding import Embedding
from ..nn.rmsnorm import RMSNorm
from .parallelize import LinearPlan, parallel_copy, set_submodule
from ..redistribute import gather_tokens_features
from .loss import VocabParallelCausalLMLoss


@dataclass(frozen=True)
class Pair:
    """Normal ``producers`` (sharing the stream as input) feeding the transposed ``consumer`` (whose output is
    the stream) through per-token, per-unit operations. ``unit``: rows split over y only in whole units
    (``head_dim`` for attention)."""

    producers: tuple[str, ...]
    consumer: str
    unit: int = 1


@dataclass(frozen=True)
class TransformerPlan:
    """Names of the pieces of a decoder-only transformer (patterns: ``*`` matches one path component).

    ``embedding``: the token ``nn.Embedding``; ``norms``: RMS norms over the hidden features (``weight [h]`` and
    ``variance_epsilon`` or ``eps``); ``pairs``: every Linear of the blocks; ``head``: the ``[V, h]`` LM head
    (None for a base model); ``batch_inputs``: forward arguments whose first dimension is the batch, split over
    z by sequence before the model runs. Every ``nn.Linear`` of the model must be named, and nothing else may
    mix hidden features, since the stream is sharded."""

    embedding: str
    norms: tuple[str, ...]
    pairs: tuple[Pair, ...]
    head: Optional[str] = None
    batch_inputs: tuple[str, ...] = ("input_ids", "attention_mask", "position_ids", "labels", "shift_labels")
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
    linears: dict[str, LinearPlan]
    head: Optional[str]


def resolve(model: nn.Module, grid: Grid, plan: TransformerPlan) -> _Resolved:
    """Concrete module names and Linear layouts of ``plan`` on ``model``; raises (before any collective, on every
    rank alike) a ValueError naming the module, the value and the fix when the model does not fit the grid."""
    gx, gy = grid.size("x"), grid.size("y")
    emb_name = _expand(model, plan.embedding, (nn.Embedding,), "embedding")
    if len(emb_name) != 1:
        raise ValueError(f"plan: embedding {plan.embedding!r} matches {emb_name}; name one module")
    emb: nn.Embedding = model.get_submodule(emb_name[0])
    h = emb.embedding_dim
    checks = [(f"hidden size {h} ({emb_name[0]})", h, gx, "x")]
    norms = [n for pat in plan.norms for n in _expand(model, pat, (nn.Module,), "norm")]
    for n in norms:
        w = getattr(model.get_submodule(n), "weight", None)
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != (h,) or _eps(model.get_submodule(n)) is None:
            raise ValueError(f"plan: norm {n} is not an RMS norm over the {h} hidden features (weight [{h}] and "
                             f"variance_epsilon/eps)")
    linears: dict[str, LinearPlan] = {}
    for pr in plan.pairs:
        for consumer in _expand(model, pr.consumer, (nn.Linear,), "consumer"):
            producers = [_same_layer(p, consumer, pr.consumer) for p in pr.producers]
            for p in producers:
                _expand(model, p, (nn.Linear,), "producer")
                lin = model.get_submodule(p)
                checks += [(f"{p}.in_features", lin.in_features, gx, "x"),
                           (f"{p} heads/units ({lin.out_features}/{pr.unit})", lin.out_features // pr.unit, gy, "y")]
                if lin.out_features % pr.unit or lin.in_features != h:
                    raise ValueError(f"plan: {p} maps {lin.in_features} -> {lin.out_features} features; a producer "
                                     f"takes the {h} hidden features and gives whole units of {pr.unit}")
                linears[p] = LinearPlan(False, "sharded", "sharded", unit=pr.unit)
            lin = model.get_submodule(consumer)
            if lin.out_features != h or lin.in_features % pr.unit:
                raise ValueError(f"plan: {consumer} maps {lin.in_features} -> {lin.out_features} features; a "
                                 f"consumer gives the {h} hidden features from whole units of {pr.unit}")
            checks += [(f"{consumer}.out_features", lin.out_features, gx, "x"),
                       (f"{consumer} heads/units ({lin.in_features}/{pr.unit})", lin.in_features // pr.unit, gy, "y")]
            linears[consumer] = LinearPlan(True, "sharded", "sharded", after=tuple(producers), unit=pr.unit)
    head = None
    if plan.head is not None:
        (head,) = _expand(model, plan.head, (nn.Linear,), "head")
        lin = model.get_submodule(head)
        if lin.weight is emb.weight:
            raise ValueError(f"plan: {head} shares its weight with {emb_name[0]} (tied embeddings), which the "
                             f"sharded-stream plan does not support; untie them or use plan={{}} (drop-in)")
        checks.append((f"{head} vocabulary", lin.out_features, gy, "y"))
        linears[head] = LinearPlan(False, "sharded", "sharded")
    others = sorted(n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in linears)
    if others:
        raise ValueError(f"plan {plan.name!r}: Linear modules {others} are not in the plan; the stream is sharded, "
                         f"so every Linear must be a producer, consumer or the head")
    for what, value, g, dim in checks:
        if value % g:
            raise ValueError(f"plan {plan.name!r}: {what}={value} is not divisible by G{dim}={g} of grid "
                             f"{grid.shape}; choose a grid whose G{dim} divides {value} (or plan={{}}: drop-in)")
    return _Resolved(emb_name[0], norms, linears, head)


def _eps(norm: nn.Module) -> Optional[float]:
    for attr in ("variance_epsilon", "eps"):
        v = getattr(norm, attr, None)
        if isinstance(v, float):
            return v
    return None


def apply_plan(model: nn.Module, grid: Grid, plan: TransformerPlan) -> nn.Module:
    """Swap ``model``'s pieces in place as the module docstring says; returns the model."""
    r = resolve(model, grid, plan)
    emb = model.get_submodule(r.embedding)
    set_submodule(model, r.embedding, Embedding.from_dense(emb, grid, "x"))
    for n in r.norms:
        norm = model.get_submodule(n)
        set_submodule(model, n, RMSNorm.from_dense(norm.weight, _eps(norm), grid, "x"))
    made = {n: parallel_copy(model.get_submodule(n), grid, p) for n, p in r.linears.items()}
    for n, layer in made.items():
        set_submodule(model, n, layer)
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
        gz = self.grid.size("z")
        b = ids.shape[0]
        if ids.dim() != 2 or b % gz:
            raise ValueError(f"axgrid plan: input_ids of shape {tuple(ids.shape)}: a [batch, seq] batch whose "
                             f"{b} sequences divide over Gz={gz} (attention needs whole sequences); use a batch "
                             f"per data-parallel rank that is a multiple of {gz}")
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
