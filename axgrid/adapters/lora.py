"""Put LoRA adapters on a parallelized model, and fold them back into it.

    model = axgrid.from_pretrained(path, grid)             # or axgrid.parallelize(hf_model, grid)
    axgrid.lora(model, grid, axgrid.LoraConfig(r=16, alpha=32, targets=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])   # the adapters only
    ...                                                    # train as usual (zero, overlap, train_step)
    axgrid.merge_lora(model)                               # W += s·B A on each rank's block, adapters gone

:func:`lora` freezes every parameter of the model (``requires_grad=False``, as ``peft.get_peft_model`` does: no
gradient, so no bucket, no optimizer state, no reduce-scatter over z) and gives each targeted ``axgrid.nn.Linear``
an :class:`axgrid.adapters.layer.LoraAdapter` in its own layout (the math and its collectives are that module's).
Targets match module names as PEFT's ``target_modules`` list does: the whole name or its last components
(``"q_proj"``, ``"self_attn.q_proj"``). A fused layer (Phi-3's ``qkv_proj``) gets one adapter over its whole output,
as in PEFT. Call it before ``grid.watch`` / ``shard_optimizer`` (they pack the trainable parameters).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import nn

from ..core.grid import Grid
from ..tensor_parallel.linear import Linear
from .layer import LoraAdapter


@dataclass(frozen=True)
class LoraConfig:
    """What :func:`lora` adds: rank ``r`` (> 0), scale ``alpha / r``, the target module names, dropout on the
    adapter's input (PEFT's ``lora_dropout``)."""

    r: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = field(default=("q_proj", "v_proj"))
    dropout: float = 0.0

    def check(self) -> None:
        """One line naming a bad value (raised on every rank alike: nothing here communicates)."""
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0:
            raise ValueError(f"LoRA r={self.r!r} must be a positive integer (the adapters' rank, e.g. 8 or 16)")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not math.isfinite(self.alpha):
            raise ValueError(f"LoRA alpha={self.alpha!r} must be a finite number (the scale is alpha / r)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout={self.dropout!r} must be in [0, 1)")
        if isinstance(self.targets, str) or not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise ValueError(f"LoRA targets={self.targets!r} must be a non-empty list of module names "
                             f"(e.g. ['q_proj', 'v_proj'])")


def matches(name: str, target: str) -> bool:
    """Whether module ``name`` is targeted by ``target`` (PEFT's list rule: equal, or its trailing components)."""
    return name == target or name.endswith("." + target)


def targeted(model: nn.Module, targets: Sequence[str]) -> dict[str, nn.Module]:
    """The modules of ``model`` that ``targets`` name, by qualified name; a ValueError names a target that matches
    no module, or matches one that is not an ``axgrid.nn.Linear``."""
    found: dict[str, nn.Module] = {}
    for t in targets:
        hits = {n: m for n, m in model.named_modules() if n and matches(n, t)}
        if not hits:
            raise ValueError(f"LoRA target {t!r} matches no module of {type(model).__name__}; module names end "
                             f"in e.g. {sorted({n.rsplit('.', 1)[-1] for n, m in model.named_modules() if isinstance(m, Linear)})}")
        bad = [n for n, m in hits.items() if not isinstance(m, Linear)]
        if bad:
            raise ValueError(f"LoRA target {t!r} matches {bad[0]!r}, a {type(hits[bad[0]]).__name__}, not an "
                             f"axgrid.nn.Linear: parallelize the model first, or name its projections")
        found.update(hits)
    return found


def lora(model: nn.Module, grid: Grid, config: Optional[LoraConfig] = None, *, r: Optional[int] = None,
         alpha: Optional[float] = None, targets: Optional[Sequence[str]] = None,
         dropout: Optional[float] = None) -> nn.Module:
    """Freeze ``model`` and add a LoRA adapter to each targeted parallel Linear (``config``, or its fields as
    keywords); returns ``model``, which remembers the config (``model.axgrid_lora``). Checked before anything
    changes (the same on every rank, no collective)."""
    base = config or LoraConfig()
    over = {k: v for k, v in dict(r=r, alpha=alpha, targets=None if targets is None else tuple(targets),
                                  dropout=dropout).items() if v is not None}
    cfg = LoraConfig(**{**base.__dict__, **over})
    cfg.check()
    if getattr(model, "axgrid_lora", None) is not None:
        raise ValueError("this model has LoRA adapters already (axgrid.merge_lora folds them in first)")
    layers = targeted(model, cfg.targets)
    for n, m in layers.items():
        if m.grid is not grid:
            raise ValueError(f"LoRA: {n} lives on another grid ({m.grid.shape}) than the one given ({grid.shape})")
    experts = sorted(n for n, m in layers.items() if getattr(m.weight, "axgrid_expert", False))
    if experts and grid.size("e") > 1:
        kinds = sorted({n.rsplit(".", 1)[-1] for n in experts})      # the same words on every rank
        raise ValueError(f"LoRA: the targets {list(cfg.targets)} take experts' layers ({', '.join(kinds)}) under expert "
                         f"parallelism (ep={grid.size('e')}), whose adapters are not supported yet; target the "
                         f"attention or dense layers, or use ep=1")
    if any(getattr(p, "axgrid_buckets", None) is not None for p in model.parameters()):
        raise ValueError("LoRA: the model's data-parallel buckets are built already (grid.watch, sync_gradients or "
                         "shard_optimizer ran): add the adapters first, then build the optimizer")
    for p in model.parameters():
        p.requires_grad_(False)
    for n in sorted(layers):                        # one order on every rank: the adapters' seeds
        layers[n].lora = LoraAdapter(layers[n], cfg.r, cfg.alpha, cfg.dropout)
    model.axgrid_lora = cfg
    return model


def adapters(model: nn.Module) -> dict[str, LoraAdapter]:
    """The model's adapters by the qualified name of the Linear they adapt."""
    return {n: m.lora for n, m in model.named_modules() if isinstance(m, Linear) and m.lora is not None}


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (``W += s·B A``, this rank's block, then its z-part: no
    communication) and remove the adapters; the base stays frozen. Returns ``model``, now a plain parallel model
    (``axgrid.export_pretrained`` writes it)."""
    for layer_name, ad in adapters(model).items():
        layer = model.get_submodule(layer_name)
        sh = layer.sharding
        for p in (ad.A, ad.B):
            layer.runtime.dp.before_use(p)        # zero >= 1 with ODP: the last step's all-gather over d first
        flat = ad.delta_block().reshape(-1)
        flat = torch.cat([flat, flat.new_zeros(sh.padded_numel - sh.block_numel)])
        with torch.no_grad():
            layer.weight.add_(flat[sh.shard_start: sh.shard_start + sh.shard_numel].to(layer.weight.dtype))
        layer.lora = None
    model.axgrid_lora = None
    return model
