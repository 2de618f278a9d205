"""Build a model with no parameter memory, then give each parameter its data in place.

:func:`parameters_on_meta` puts every parameter a module registers while it is built on the meta device and
leaves buffers where they are, so buffers a model computes at construction (rotary ``inv_freq``, masks) are
computed for real. It is accelerate's ``init_empty_weights(include_buffers=False)``, written here in a few lines
because accelerate is not among our dependencies and ``transformers``' own meta initialisation puts the
buffers on meta too (it recomputes them per model family afterwards). The patch of
``nn.Module.register_parameter`` lasts only for the ``with`` block. It also marks each module that registers a
parameter with transformers' own "already initialised" flag (``_is_hf_initialized``, which its loader sets on
loaded modules): initialising meta tensors runs torch's Python reference kernels, half the time of building a
model, for parameters the files fill anyway (one left unfilled is an error, not a random init). A model that is
not a transformers one ignores the flag.

:func:`materialize` replaces a meta parameter's data with a real tensor *in place*: the Python object stays the
same (via ``torch.utils.swap_tensors``), so ties between modules, ``axgrid_tile`` marks and anything holding the
parameter still see it.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Parameters registered inside the block are created on the meta device; buffers are untouched."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param) -> None:
        original(module, name, param)
        module.__dict__["_is_hf_initialized"] = True      # transformers: skip its init of what the files fill
        if param is not None and param.device.type != "meta":
            kept = module._parameters[name]
            meta = nn.Parameter(kept.detach().to("meta"), requires_grad=kept.requires_grad)
            _keep_attributes(kept, meta)
            module._parameters[name] = meta

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def materialize(param: nn.Parameter, data: torch.Tensor) -> None:
    """Give the meta parameter ``param`` the tensor ``data`` (same shape) in place; its attributes are kept."""
    if param.device.type != "meta":
        raise ValueError(f"materialize: the parameter is on {param.device}, not on meta")
    if tuple(data.shape) != tuple(param.shape):
        raise ValueError(f"materialize: data of shape {tuple(data.shape)} for a parameter of {tuple(param.shape)}")
    if getattr(param, "_post_accumulate_grad_hooks", None) or getattr(param, "_backward_hooks", None):
        raise RuntimeError("materialize: a gradient hook was registered on a meta parameter; it would be lost: "
                           "register hooks once the parameter holds data")
    real = nn.Parameter(data, requires_grad=param.requires_grad)
    _keep_attributes(param, real)
    torch.utils.swap_tensors(param, real)


def _keep_attributes(old: torch.Tensor, new: torch.Tensor) -> None:
    """Copy ``old``'s Python attributes (axgrid marks, transformers' flags) to ``new``, except those ``new`` has of
    its own (a fake tensor's device and mode, in a dry run)."""
    new.__dict__.update({k: v for k, v in old.__dict__.items() if k not in new.__dict__})
