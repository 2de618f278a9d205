"""The one place that counts a model's floating-point work (the AxoNN papers' GPT formula, a LLaMA-family decoder's)
and the GPT's parameters.

Per training iteration (forward + backward), batch ``B`` sequences of ``S`` tokens, ``L`` layers, hidden ``h``,
vocabulary ``V``, MLP width ``4h``, a multiply-add counted as 2 FLOPs:

- with full activation recompute (the forward runs twice):  ``96·B·S·L·h²·(1 + S/(6h) + V/(16·L·h))``
- without recompute:                                          ``72·B·S·L·h²·(1 + S/(6h) + V/(12·L·h))``

``24·B·S·L·h²`` is one forward of the four FC layers (2·12h² per token and layer), ``S/(6h)`` adds the two
attention GEMMs (``QKᵀ`` and ``A·V``), the last term is the logit GEMM (``2·B·S·h·V`` per forward, never
recomputed, hence the different denominators). Backward costs twice the forward; recompute adds one more
forward of the blocks. TFLOP/s computed with the formula that matches the run (96 with recompute) therefore
count the recomputed forward as work done, as the papers do.
"""
from __future__ import annotations

from typing import Any


def gpt_flops_per_iteration(batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool) -> float:
    """FLOPs of one training iteration over ``batch`` sequences (see the module docstring)."""
    b, s, l, h, v = float(batch), float(seq), float(layers), float(hidden), float(vocab)
    if recompute:
        return 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
    return 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h))


def gpt_parameters(layers: int, hidden: int, seq: int, vocab: int, ffn: int | None = None, bias: bool = True,
                   tied_head: bool = False) -> int:
    """Dense parameter count of :class:`axgrid.models.GPT` (embeddings, blocks, final norm, head)."""
    h, f = hidden, ffn or 4 * hidden
    per_block = 3 * h * h + h * h + f * h + h * f + 4 * h            # QKV, out, up, down weights; 2 layer norms
    if bias:
        per_block += 3 * h + h + f + h
    head = 0 if tied_head else vocab * h
    return vocab * h + seq * h + layers * per_block + 2 * h + head


def llama_flops(config: Any, batch: int, seq: int, recompute: bool) -> float:
    """FLOPs of one training step of a LLaMA-family decoder (a Hugging Face config: ``hidden_size``,
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``, ``vocab_size``,
    optionally ``head_dim``: ``axgrid.spec.hf_head_dim``) on ``batch x seq`` tokens: ``(6 + 2r)·P·B·S + (6 + 2r)·2·L·S·a·B·S`` with ``P`` the
    parameters of the decoder's and head's matrices, ``a = heads·head_dim`` the attention width and ``r = 1`` with
    recompute (one more forward of the layers)."""
    h, layers = config.hidden_size, config.num_hidden_layers
    from .shape import hf_head_dim          # shape.py reads this module's GPT counts
    hd = hf_head_dim(config)
    q, kv, f = config.num_attention_heads * hd, config.num_key_value_heads * hd, config.intermediate_size
    matrices = layers * (h * q + 2 * h * kv + q * h + 3 * h * f) + h * config.vocab_size
    per_token = 6 + 2 * int(recompute)
    tokens = batch * seq
    return per_token * matrices * tokens + per_token * 2 * layers * seq * q * tokens
