"""What :func:`axgrid.parallelize` must leave dense, and the summary it reports.

Tied weights: an ``nn.Linear`` whose weight (or bias) is also held by another module -- HF GPT-2's ``lm_head``
and ``wte``, LLaMA/Qwen with ``tie_word_embeddings=True``, two layers sharing one Parameter, or Parameters that
alias the same memory -- would be untied by replacing the Linear with a parallel one (the new layer gets its own
sharded copy, the other module keeps the old tensor, and training diverges from the dense model). Such a
Linear stays a dense ``nn.Linear``: both users keep reading one tensor, its gradient sums both uses (every rank
of the tensor-parallel block computes it on the same replicated activations) and ``sync_gradients`` averages it
over d like any other dense parameter. It is correct, but the layer is not parallelised.

Not parallelisable: anything that is not exactly ``nn.Linear`` but holds a 2-D ``weight`` (HF ``Conv1D``, an
``nn.Linear`` subclass with its own forward such as ``nn.MultiheadAttention``'s ``out_proj``).
Embeddings are not matmul layers and are not reported.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from ..tensor_parallel.linear import Linear

_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)


def _owners(model: nn.Module) -> dict[int, list[tuple[str, nn.Module]]]:
    """Parameter id -> the distinct modules holding it directly, with one qualified name each."""
    out: dict[int, list[tuple[str, nn.Module]]] = {}
    for mname, mod in model.named_modules():                    # each module once (first path)
        for pname, p in mod._parameters.items():
            if p is not None:
                out.setdefault(id(p), []).append((f"{mname}.{pname}" if mname else pname, mod))
    return out


def _memory_key(p: torch.Tensor) -> Optional[tuple]:
    """Identifies the memory a parameter reads (views of one flat buffer at different offsets differ)."""
    if p.device.type == "meta" or p.numel() == 0:
        return None
    return (p.device, p.data_ptr(), tuple(p.shape), tuple(p.stride()))


def tied_linears(model: nn.Module, linears: dict[str, nn.Linear]) -> dict[str, str]:
    """``{linear name: why it must stay dense}`` for every Linear whose weight or bias is shared with another
    module (the same Parameter, or another Parameter over the same memory)."""
    owners = _owners(model)
    params = {id(p): p for m in model.modules() for p in m._parameters.values() if p is not None}
    by_memory: dict[tuple, list[int]] = {}
    for pid, p in params.items():
        key = _memory_key(p)
        if key is not None:
            by_memory.setdefault(key, []).append(pid)
    out: dict[str, str] = {}
    for name, lin in linears.items():
        for attr in ("weight", "bias"):
            p = getattr(lin, attr)
            if p is None:
                continue
            sharers = [f"{n} ({type(m).__name__})" for n, m in owners[id(p)] if m is not lin]
            sharers += [f"{owners[q][0][0]} (same memory)" for q in by_memory.get(_memory_key(p), ())
                        if q != id(p)]
            if sharers:
                out[name] = (f"{attr} is tied to {', '.join(sharers)}; kept dense so they stay one tensor "
                             f"(a parallel copy would silently untie them)")
                break
    return out


def unsupported_modules(model: nn.Module) -> dict[str, str]:
    """``{name: why}`` for matmul-like modules parallelize cannot replace (2-D weight, not exactly nn.Linear)."""
    out: dict[str, str] = {}
    for name, mod in model.named_modules():
        if type(mod) is nn.Linear or isinstance(mod, _EMBEDDINGS) or type(mod).__module__.startswith("axgrid."):
            continue
        w = mod._parameters.get("weight")
        if isinstance(mod, nn.Linear):
            out[name] = f"{type(mod).__name__} subclasses nn.Linear with its own behaviour"
        elif w is not None and w.dim() == 2:
            out[name] = f"{type(mod).__name__} is not nn.Linear"
    return out


def _names(names: list[str], limit: int = 6) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


@dataclass
class ParallelizeSummary:
    """What :func:`axgrid.parallelize` did (``model.axgrid_summary``): the layers made parallel, and every
    matmul-like layer left dense with the reason."""

    parallel: list[str] = field(default_factory=list)
    dense: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"axgrid.parallelize: {len(self.parallel)} layer(s) parallel, {len(self.dense)} left dense"]
        if self.parallel:
            lines.append(f"  parallel: {_names(self.parallel, 12)}")
        for why, names in _by_reason(self.dense).items():
            lines.append(f"  dense {_names(names)}: {why}")
        return "\n".join(lines)


def _by_reason(reasons: dict[str, str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name, why in reasons.items():
        groups.setdefault(why, []).append(name)
    return groups


def report(model: nn.Module, rank: int, dense: dict[str, str], tied: dict[str, str],
           show: bool = False) -> ParallelizeSummary:
    """Warn about tied and non-Linear layers left dense (one warning per reason), attach the summary to
    ``model.axgrid_summary`` and print it on rank 0 when ``show``. ``dense``: Linear layers the caller left dense
    (it warned about those not in ``tied``); ``tied``: the ones kept dense for a tie. Parallel layers are the
    model's ``axgrid.nn.Linear`` modules."""
    other = unsupported_modules(model)
    for why, names in _by_reason({**tied, **other}).items():
        warnings.warn(f"axgrid.parallelize: {_names(names)} left dense: {why}", stacklevel=3)
    parallel = [n for n, m in model.named_modules() if isinstance(m, Linear)]
    summary = ParallelizeSummary(parallel, {**dense, **other})
    model.__dict__["axgrid_summary"] = summary
    if show and rank == 0:
        print(summary, flush=True)
    return summary
