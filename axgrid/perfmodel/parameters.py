"""The trainable tensors of one rank, for every family perfmodel prices, and their gradients' elements on N grids.

One list per family (:func:`trainable_parameters`, ``model.parameters()`` order), the one the collective replay
(``perfmodel.step``) uses. The data-parallel
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


class GPTParam(NamedTuple):
    """One trainable tensor on one rank: ``key`` (e.g. "b3.up.w", "l3.q_proj.w"), elements on this rank, and
    ``kind``: "fc_w", "fc_b", "ln" or "emb"."""

    key: str
    elems: int
    kind: str


def gpt_parameters(spec: TransformerShape, grid: tuple[int, int, int, int]) -> list[GPTParam]:
    """The GPT's trainable tensors of one rank in ``model.parameters()`` order (zero-size tensors left out)."""
    gx, gy, gz, _ = (int(v) for v in grid)
    hx = ceil_div(spec.hidden, gx)
    out = [GPTParam("wte", spec.vocab * hx, "emb"), GPTParam("wpe", spec.seq * hx, "emb")]
    fc = {L.name: L for L in spec.block_layers()}
    vol = {name: layer_volumes(L, gx, gy, gz, 1) for name, L in fc.items()}
    for i in range(spec.layers):
        for name in spec.block_modules():
            if name not in fc:                            # a layer norm
                out += [GPTParam(f"b{i}.{name}.w", hx, "ln"), GPTParam(f"b{i}.{name}.b", hx, "ln")]
                continue
            out.append(GPTParam(f"b{i}.{name}.w", int(vol[name].shard), "fc_w"))
            if fc[name].bias:
                out.append(GPTParam(f"b{i}.{name}.b", int(vol[name].bias_loc), "fc_b"))
    out += [GPTParam("ln_f.w", hx, "ln"), GPTParam("ln_f.b", hx, "ln")]
    out.append(GPTParam("head.w", int(layer_volumes(spec.head_layer(), gx, gy, gz, 1).shard), "fc_w"))
    return out


def layer_modules(spec: TransformerShape) -> list[str]:
    """One decoder layer's parameterised modules in ``model.parameters()`` order, as transformers registers them:
    the attention's FC layers (Phi-3: ``o_proj`` before ``qkv_proj``), its head norms (``q_norm``, ``k_norm``: Qwen3,
    Gemma 3), the MLP's FC layers, then the hidden-width norms in forward order (Gemma 3's four)."""
    layers = spec.block_layers()
    o = next(i for i, layer in enumerate(layers) if layer.transposed)       # the attention's output projection
    attention = [layer.name for layer in layers[:o + 1]]
    if spec.family == "phi3":
        attention = attention[-1:] + attention[:-1]
    norms = [n for layer in layers for n in (layer.norm, layer.post_norm) if n]
    return (attention + (list(HEAD_NORMS) if spec.head_norms else []) + [layer.name for layer in layers[o + 1:]]
            + norms)


def decoder_parameters(spec: TransformerShape, grid: tuple[int, int, int, int]) -> list[GPTParam]:
    """A Hugging Face decoder's trainable tensors of one rank in ``model.parameters()`` order: the token table
    (tied: the head's weight shard), per layer its modules (:func:`layer_modules`: an FC layer's weight shard, then
    its bias; a head norm's ``[d]``, replicated; a hidden-width norm's ``[h/Gx]``), the final norm, the head's
    weight shard (untied)."""
    gx, gy, gz, _ = (int(v) for v in grid)
    hx = ceil_div(spec.hidden, gx)
    head = int(layer_volumes(spec.head_layer(), gx, gy, gz, 1).shard)
    out = [GPTParam("embed_tokens", head, "fc_w") if spec.tied else GPTParam("embed_tokens", spec.vocab * hx, "emb")]
    fc = {layer.name: (layer, layer_volumes(layer, gx, gy, gz, 1)) for layer in spec.block_layers()}
    modules = layer_modules(spec)
    for i in range(spec.layers):
        for name in modules:
            if name in fc:
                layer, v = fc[name]
                out.append(GPTParam(f"l{i}.{name}.w", int(v.shard), "fc_w"))
                if layer.bias:
                    out.append(GPTParam(f"l{i}.{name}.b", int(v.bias_loc), "fc_b"))
            else:
                out.append(GPTParam(f"l{i}.{name}", spec.head_dim if name in HEAD_NORMS else hx, "ln"))
    out.append(GPTParam("norm", hx, "ln"))
    if not spec.tied:
        out.append(GPTParam("lm_head", head, "fc_w"))
    return out


def trainable_parameters(spec: TransformerShape, grid: tuple[int, int, int, int]) -> list[GPTParam]:
    """The trainable tensors of one rank of ``grid`` in ``model.parameters()`` order."""
    return gpt_parameters(spec, grid) if spec.is_gpt else decoder_parameters(spec, grid)


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


__all__ = ["GPTParam", "HEAD_NORMS", "decoder_parameters", "gpt_parameters", "gradient_elements", "layer_modules",
           "trainable_parameters"]
