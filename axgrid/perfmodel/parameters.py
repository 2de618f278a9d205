"""The trainable tensors of one rank, for every family perfmodel prices, and their gradients' elements on N grids.

One list for every family (:func:`trainable_parameters`, ``model.parameters()`` order; the families differ in the
order they register a block's modules, :func:`layer_modules`, their norms' vectors, their tables and a tied head),
the one the collective replay (``perfmodel.step``) uses. The data-parallel
buckets (``perfmodel.buckets.pack``), the memory of each ``zero`` mode and the bytes over d all read the elements
from here, so the time model, the memory model and the replay pack the same tensors.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from typing import NamedTuple

from axgrid.spec import TransformerShape, ceil_div

from .comm import layer_volumes

#: the head norms' module names (RMS norms over each head's ``head_dim`` features, after q_proj and k_proj)
HEAD_NORMS = ("q_norm", "k_norm")
#: a MoE layer's router (``[E, h]``, with Qwen2-MoE's shared-expert gate ``[1, h]``): held ``[·, h/Gx]`` on every
#: rank, its gradient packed with the dense ones (``perfmodel.moe``; the experts' are reduced over their replicas)
ROUTERS = ("router",)


class GPTParam(NamedTuple):
    """One trainable tensor on one rank: ``key`` (e.g. "b3.up.w", "l3.input_layernorm.w"), elements on this rank, and
    ``kind``: "fc_w", "fc_b", "ln" or "emb"."""

    key: str
    elems: int
    kind: str


def layer_modules(spec: TransformerShape) -> list[str]:
    """One block's parameterised modules in ``model.parameters()`` order. The GPT registers them in forward order
    (``TransformerShape.block_modules``: each norm before its layer). A Hugging Face decoder layer as transformers
    registers them: the attention's FC layers (Phi-3: ``o_proj`` before ``qkv_proj``), its head norms (``q_norm``,
    ``k_norm``: Qwen3, Gemma 3), the MLP's FC layers, then the hidden-width norms in forward order (Gemma 3's
    four)."""
    if spec.is_gpt:
        return list(spec.block_modules())
    layers = spec.block_layers()
    o = next(i for i, layer in enumerate(layers) if layer.transposed)       # the attention's output projection
    attention = [layer.name for layer in layers[:o + 1]]
    if spec.family == "phi3":
        attention = attention[-1:] + attention[:-1]
    norms = [n for layer in layers for n in (layer.norm, layer.post_norm) if n]
    return (attention + (list(HEAD_NORMS) if spec.head_norms else []) + (list(ROUTERS) if spec.is_moe else [])
            + [layer.name for layer in layers[o + 1:]] + norms)


def trainable_parameters(spec: TransformerShape, grid: tuple[int, int, int, int]) -> list[GPTParam]:
    """The trainable tensors of one rank of ``grid`` in ``model.parameters()`` order: the token table (``[V, h/Gx]``;
    tied to the head: the head's weight shard), the GPT's position table ``[S, h/Gx]``; per block its modules
    (:func:`layer_modules`: an FC layer's weight shard, then its bias; a norm's weight (and a LayerNorm's bias)
    ``[h/Gx]``; a head norm's ``[d]``, replicated); the final norm; an untied head's weight shard. Keys name the
    runtime's modules: the GPT's ``wte``, ``wpe``, ``b3.ln1.w``, ``b3.up.b``, ``ln_f.w``, ``head.w``; a decoder's
    ``embed_tokens``, ``l3.q_proj.w``, ``l3.input_layernorm.w``, ``norm.w``, ``lm_head.w``."""
    gx, gy, gz, _ = (int(v) for v in grid)
    hx = ceil_div(spec.hidden, gx)
    head = spec.head_layer()
    head_shard = int(layer_volumes(head, gx, gy, gz, 1).shard)
    block, token = ("b", "wte") if spec.is_gpt else ("l", "embed_tokens")
    norm = (".w", ".b")[:spec.norm_parameters]
    out = [GPTParam(token, head_shard, "fc_w") if spec.tied else GPTParam(token, spec.vocab * hx, "emb")]
    if spec.is_gpt:                                       # learned positions
        out.append(GPTParam("wpe", spec.seq * hx, "emb"))
    fc = {layer.name: (layer, layer_volumes(layer, gx, gy, gz, 1)) for layer in spec.block_layers()}
    modules = layer_modules(spec)
    for i in range(spec.layers):
        for name in modules:
            key = f"{block}{i}.{name}"
            if name in fc:
                layer, v = fc[name]
                out.append(GPTParam(f"{key}.w", int(v.shard), "fc_w"))
                if layer.bias:
                    out.append(GPTParam(f"{key}.b", int(v.bias_loc), "fc_b"))
            elif name in HEAD_NORMS:
                out.append(GPTParam(f"{key}.w", dict(zip(HEAD_NORMS, spec.head_norm_widths()))[name], "ln"))
            elif name in ROUTERS:
                out.append(GPTParam(key, spec.router_parameters() // spec.hidden * hx, "router"))
            else:
                out += [GPTParam(key + suffix, hx, "ln") for suffix in norm]
    out += [GPTParam(head.norm + suffix, hx, "ln") for suffix in norm]
    if not spec.tied:
        out.append(GPTParam(f"{head.name}.w", head_shard, "fc_w"))
    return out



@lru_cache(maxsize=4096)
def _elements(spec: TransformerShape, gx: int, gy: int, gz: int) -> tuple[int, ...]:
    """Elements of each trainable tensor of one rank of (``gx``, ``gy``, ``gz``, any Gd), ``model.parameters()``
    order; cached: a ranking asks for the same few hundred grids' lists thousands of times (a shape is frozen)."""
    return tuple(p.elems for p in trainable_parameters(spec, (gx, gy, gz, 1)))


def gradient_elements(spec: TransformerShape, gx, gy, gz) -> list[np.ndarray]:
    """Elements of every gradient on one rank of each grid (``gx``, ``gy``, ``gz``: arrays [N]), in the buckets'
    packing order (reverse ``model.parameters()``), each an int64 array [N]. The lists are built once per distinct
    (Gx, Gy, Gz) and must have one length (a family's tensors do not depend on the grid)."""
    gx, gy, gz = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64).reshape(-1) for a in (gx, gy, gz)))
    triples, which = np.unique(np.stack([gx, gy, gz], axis=1), axis=0, return_inverse=True)
    table = [_elements(spec, int(x), int(y), int(z)) for x, y, z in triples]
    lengths = {len(t) for t in table}
    if len(lengths) != 1:
        raise ValueError(f"{spec.name}: the trainable tensors' count depends on the grid ({sorted(lengths)}); "
                         f"perfmodel packs one list per family")
    elems = np.asarray(table, dtype=np.int64)[np.asarray(which).reshape(-1)]      # [N, tensors]
    return [elems[:, i] for i in range(elems.shape[1] - 1, -1, -1)]


__all__ = ["GPTParam", "HEAD_NORMS", "ROUTERS", "gradient_elements", "layer_modules",
           "trainable_parameters"]
