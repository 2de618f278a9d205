"""The end-of-sequence and padding ids :func:`axgrid.generate` uses when the call gives none: transformers' defaults.

transformers' ``generate`` reads each id it is not given from the model's ``generation_config`` (which a model
builds from its ``config`` and ``from_pretrained`` reads from ``generation_config.json``), and pads with the first
EOS id when there is no pad id. Doing the same here is what makes ``axgrid.generate(model, prompt, grid, n)`` stop
where ``model.generate(prompt, max_new_tokens=n)`` stops: SmolLM2-Instruct ends its answer with ``<|im_end|>``
(id 2, its configured EOS) and both stop there. axgrid's own GPT has no generation config: no EOS unless given.
``eos_token_id=[]`` turns stopping off.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from torch import nn

TokenIds = Union[int, Sequence[int], None]


def _configured(model: nn.Module, name: str) -> TokenIds:
    """``name`` from the model's generation config, else from its config (None when neither sets it)."""
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, name, None)
        if value is not None:
            return value
    return None


def special_tokens(model: nn.Module, eos_token_id: TokenIds, pad_token_id: Optional[int]
                   ) -> tuple[TokenIds, Optional[int]]:
    """``(eos, pad)``: each given id as given, each missing one from the model's generation config, then its
    config (pad's last default, the first EOS id, is applied by the loop after the ids are checked)."""
    eos = eos_token_id if eos_token_id is not None else _configured(model, "eos_token_id")
    pad = pad_token_id if pad_token_id is not None else _configured(model, "pad_token_id")
    return eos, pad


__all__ = ["special_tokens"]
