"""The one AdamW every trainer of the project builds: the drivers (train_gpt, finetune, memorization) and the dry
run, so that what the dry run measures (and perfmodel prices) is what a run steps.

    opt = adamw(model.optimizer_groups(0.1), lr=3e-4, betas=(0.9, 0.95))   # fused where the device has the kernel
    adamw_kind(opt)                                                         # "fused" | "foreach" | "for-loop"

Which implementation: torch's own rule for ``fused=True`` (``torch.optim.optimizer._default_to_fused_or_foreach``
with ``use_fused``): fused when every parameter is a floating-point tensor on a device with fused optimizer kernels
(torch 2.13: cpu, cuda, xpu, mps, hpu, mtia and the privateuse1 backend, which the dry run's fakegpu is), else
foreach where torch has foreach kernels (cuda, xpu, mtia, privateuse1), else the for-loop. torch's default when
nothing is said is foreach on CUDA, never fused; we ask for fused because it updates each tensor in one kernel
without the foreach path's intermediate lists (its ``exp_avg_sq.sqrt()`` list is one fp32 temporary per
parameter element, 4 B each, alive at the step), so the step's memory is the state alone, and it is faster. The
fused kernel keeps AdamW's 0-d ``step`` on the parameter's device (the for-each and for-loop paths keep it on the
host): perfmodel counts those 4 B per parameter tensor on the device.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices, _get_fused_kernels_supported_devices

#: The implementations torch's AdamW has, in the order the factory prefers them.
KINDS = ("fused", "foreach", "for-loop")


def _params(groups: Iterable[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for g in groups:
        out += list(g["params"]) if isinstance(g, dict) else [g]
    return out


def kind_for(params: Iterable[torch.Tensor]) -> str:
    """The implementation :func:`adamw` picks for ``params`` (see the module docstring)."""
    params = list(params)
    if all(p.device.type in _get_fused_kernels_supported_devices() and torch.is_floating_point(p) for p in params):
        return "fused"
    if all(p.device.type in _get_foreach_kernels_supported_devices() for p in params):
        return "foreach"
    return "for-loop"


def adamw(groups: Iterable[Any], *, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 0.01) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``groups`` (parameters, or parameter-group dicts such as
    :func:`axgrid.train.decay_groups`' with their own ``weight_decay``) with the implementation :func:`kind_for`
    picks, said explicitly (so a checkpoint records it and :func:`adamw_kind` reads it back)."""
    groups = [dict(g) if isinstance(g, dict) else g for g in groups]
    kind = kind_for(_params(groups))
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=kind == "fused", foreach=kind == "foreach")


def adamw_kind(opt: torch.optim.Optimizer) -> str:
    """The implementation ``opt`` (an AdamW, or the :class:`axgrid.ShardedOptimizer` around one) steps with:
    ``"fused"``, ``"foreach"`` or ``"for-loop"`` (torch's default, foreach on CUDA, when neither was said)."""
    group = opt.param_groups[0]
    if group.get("fused"):
        return "fused"
    on_foreach_devices = all(p.device.type in _get_foreach_kernels_supported_devices()
                             for p in _params(opt.param_groups))
    if group.get("foreach") or (group.get("foreach") is None and on_foreach_devices):
        return "foreach"
    return "for-loop"
