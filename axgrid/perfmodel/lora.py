"""LoRA in perfmodel (``Options.lora_r``, ``Options.lora_targets``): what ``axgrid.lora`` changes in a training
step, for the GPT and a Hugging Face decoder (``perfmodel.step``, ``perfmodel.memory``).
Torch-free; the runtime it models is ``axgrid/adapters/layer.py`` (docs/lora.md).

Each targeted FC layer ``W [n, k]`` gets ``A [r, k/G_in]`` (columns as the weight's) and ``B [n/G_out, r]`` (rows as
the weight's) on every rank, fp32 (the runtime keeps fp32 weights; a bf16 base would get fp32 adapters too); the
rest of the model is frozen.

==================  ===========================================================================================
parameters          the whole base as in full training (4 B per stored element: weight shards, biases, norms,
                    tables) + the adapters (with Gd > 1 and ``zero`` >= 1 views of the buckets: padded to Gd)
gradients, AdamW    the adapters' only (their buckets, shares and moments as :mod:`perfmodel.buckets` packs
                    them); a 4-byte ``step`` per adapter tensor
collectives         per targeted layer and micro-batch: forward AR over in_dim of ``[m', r]`` (again in the
                    recompute forward), backward AR over out_dim of ``[m', r]`` and one AR over z of both
                    gradients (``r·k/G_in + n/G_out·r``, grad dtype); over d only the adapters' buckets. Gone:
                    every RS_z of a weight gradient, AR_z of a bias, norm or table gradient, and every backward
                    of the part of the model before the first adapter (its input needs no gradient: block 0's
                    norm and first targeted layer's base, the embeddings)
FLOPs               forward ``2·m·r·(k + n)`` per targeted layer (the base's ``2·m·n·k`` unchanged); backward
                    ``dH``, ``dX``, ``dA``, ``dB``: ``4·m·r·(k + n)``; the frozen base drops its weight-gradient
                    GEMM (a third of its ``6·m·n·k``): :func:`lora_flops_change`
==================  ===========================================================================================
"""
from __future__ import annotations

from typing import Iterable, NamedTuple, Optional, Sequence

import numpy as np

from axgrid.spec import FCLayer, ceil_div

from .errors import PerfModelError


class LoraPlan(NamedTuple):
    """The adapters of a step: rank ``r`` on the FC layers named ``targets`` (block layer names, and the head's)."""

    r: int
    targets: frozenset[str]

    def targeted(self, layer: FCLayer | str) -> bool:
        return (layer if isinstance(layer, str) else layer.name) in self.targets


def layer_names(spec) -> list[str]:
    """The names LoRA may target in ``spec`` (a ``TransformerShape``, GPT or Llama-structured): its block's FC layers and
    the head."""
    return [layer.name for layer in spec.block_layers()] + [spec.head_layer().name]


def lora_targets(spec, targets: Optional[Iterable[str]] = None) -> tuple[str, ...]:
    """The checked target names (default: every FC layer of the block, as ``--lora-targets`` "all-linear" without
    the head); a name that is none of ``spec``'s FC layers raises one line listing them."""
    names = layer_names(spec)
    if targets is None:
        return tuple(names[:-1])
    targets = tuple(targets)
    if isinstance(targets, str) or not targets:
        raise PerfModelError(f"lora_targets={targets!r}: give a non-empty list of FC layer names of "
                             f"{spec.name}: {', '.join(names)}")
    bad = [t for t in targets if t not in names]
    if bad:
        raise PerfModelError(f"LoRA target {bad[0]!r} is no FC layer of {spec.name}; its layers are "
                             f"{', '.join(names)}")
    return tuple(n for n in names if n in targets)


def lora_plan(spec, opt) -> Optional[LoraPlan]:
    """``opt``'s LoRA (``Options.lora_r`` > 0) on ``spec``, or None (full training)."""
    if not getattr(opt, "lora_r", 0):
        return None
    return LoraPlan(int(opt.lora_r), frozenset(lora_targets(spec, opt.lora_targets)))


def adapter_elements(layer: FCLayer, r: int, gx, gy) -> tuple[np.ndarray, np.ndarray]:
    """Elements of this rank's ``A [r, k/G_in]`` and ``B [n/G_out, r]`` for ``layer`` (arrays over grids)."""
    gx, gy = np.asarray(gx, dtype=np.int64), np.asarray(gy, dtype=np.int64)
    g_in, g_out = (gy, gx) if layer.transposed else (gx, gy)
    return r * ceil_div(layer.k, g_in), ceil_div(layer.n, g_out) * r


def adapter_tensors(spec, plan: LoraPlan, gx, gy) -> list[np.ndarray]:
    """Elements of every adapter tensor of one rank in ``model.parameters()`` order (per targeted layer A then B,
    layers in forward order, the head last): the trainable tensors of a LoRA step."""
    out: list[np.ndarray] = []
    block = [layer for layer in spec.block_layers() if plan.targeted(layer)]
    for _ in range(spec.layers):
        for layer in block:
            out += list(adapter_elements(layer, plan.r, gx, gy))
    if plan.targeted(spec.head_layer()):
        out += list(adapter_elements(spec.head_layer(), plan.r, gx, gy))
    return out


def adapter_forward_events(layer: FCLayer, r: int, mprime: int, dtype_bytes: int) -> list[tuple[str, str, int]]:
    """The adapter's forward collective: ``H = AR_in(X_loc A^T)`` ``[m', r]`` in the compute dtype."""
    return [(layer.in_dim, "all_reduce", int(mprime) * r * dtype_bytes)]


def adapter_backward_events(layer: FCLayer, r: int, gx: int, gy: int, mprime: int, dtype_bytes: int,
                            grad_dtype_bytes: int) -> list[tuple[str, str, int]]:
    """The adapter's backward collectives: ``dH = AR_out(s·dY B)`` ``[m', r]``, then A's and B's gradients summed
    over z in one call (grad dtype)."""
    a, b = adapter_elements(layer, r, gx, gy)
    return [(layer.out_dim, "all_reduce", int(mprime) * r * dtype_bytes),
            ("z", "all_reduce", int(a + b) * grad_dtype_bytes)]


def needs_input_grad(modules: Sequence[str], layers: dict[str, FCLayer], plan: Optional[LoraPlan],
                     live: bool) -> tuple[list[bool], bool]:
    """For one block's ``modules`` (norms and FC layers, forward order): whether each one's input needs a gradient
    (so that it has a backward), given whether the block's input does (``live``); and whether the block's output
    does. Full training (``plan`` None): always. With LoRA the first targeted layer makes everything after it
    need one."""
    out = []
    for name in modules:
        out.append(live)
        if plan is None or (name in layers and plan.targeted(name)):
            live = True
    return out, live


def lora_flops_change(spec, plan: LoraPlan, tokens: int, recompute: bool) -> float:
    """What LoRA changes in the FLOPs of one step on ``tokens`` tokens (all ranks together), to add to the full
    training formula's (``axgrid.spec.gpt_flops_per_iteration``, ``llama_flops``): :func:`layer_flops_change` over
    ``spec``'s FC layers (the block's ``spec.layers`` times, the head once)."""
    layers = [(x, spec.layers, plan.targeted(x)) for x in spec.block_layers()]
    head = spec.head_layer()
    return layer_flops_change(layers + [(head, 1, plan.targeted(head))], plan.r, tokens, recompute)


def layer_flops_change(layers: Iterable[tuple[FCLayer, int, bool]], r: int, tokens: int,
                       recompute: bool) -> float:
    """The FLOP change of a LoRA step over FC ``layers`` given as (layer, how many, adapted): minus every frozen
    layer's weight-gradient GEMM ``2·m·n·k``; plus per adapted layer the adapter's forward ``2·m·r·(k + n)`` (again
    in the recompute forward when ``recompute`` and ``layer.recompute``) and backward ``4·m·r·(k + n)`` (dH, dX,
    dA, dB). The backward the part before the first adapter skips (block 0's) is still counted: under 1/L of the
    blocks' backward. The one LoRA FLOP count: perfmodel's and ``finetune.py``'s."""
    m = float(tokens)
    change = 0.0
    for layer, times, adapted in layers:
        ad = 2.0 * m * r * (layer.n + layer.k) if adapted else 0.0
        forwards = 2 if recompute and layer.recompute else 1
        change += times * (ad * (forwards + 2) - 2.0 * m * layer.n * layer.k)
    return change


__all__ = ["LoraPlan", "adapter_backward_events", "adapter_elements", "adapter_forward_events", "adapter_tensors",
           "layer_flops_change", "layer_names", "lora_flops_change", "lora_plan", "lora_targets", "needs_input_grad"]


# ------------------------------------------------------------------------------------------------ memory

class LoraStatic(NamedTuple):
    """What the data-parallel buffers of a LoRA step take per GPU (arrays), as ``memory.DataParallelBytes``: the
    frozen base's parameters plus the adapters' (buckets padded to Gd with ``zero`` >= 1), the adapters' gradients
    and AdamW state, and ``zero=2``'s full buckets (``at_block``: during the last block's backward; ``at_end``)."""

    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    at_block: np.ndarray
    at_end: np.ndarray


def lora_static_bytes(spec, plan: LoraPlan, base_elements, gx, gy, gd, zero: int, bucket_bytes: int,
                      overlap_dp: bool, reduce_scatter_copies: bool, window: int) -> LoraStatic:
    """:class:`LoraStatic` (arrays broadcast over grids): ``base_elements`` the base's stored elements on a rank
    (fp32, frozen: 4 B each, no gradient, no moments, never in a bucket); the adapters as
    :func:`adapter_tensors` lists them, packed as the runtime packs trainable parameters (reverse
    ``model.parameters()``); ``window``: ``axgrid.spec.GRADIENT_WINDOW``."""
    from .buckets import pack
    gx, gy, gd = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (gx, gy, gd)))
    shape = gx.shape
    tensors = [np.broadcast_to(t, shape).reshape(-1) for t in adapter_tensors(spec, plan, gx, gy)]
    base = 4.0 * np.broadcast_to(np.asarray(base_elements, dtype=float), shape)
    steps = 4.0 * len(tensors)
    none = np.zeros(shape)
    if zero == 0:
        elems = sum(tensors).reshape(shape).astype(float)
        return LoraStatic(base + 4.0 * elems, 4.0 * elems, 8.0 * elems + steps, none, none)
    bt = pack(tensors[::-1], 4, bucket_bytes, gd.reshape(-1))
    padded = bt.padded.reshape(shape) * 4.0
    share = (bt.padded // gd.reshape(-1)).reshape(shape) * 4.0
    if zero == 1:
        return LoraStatic(base + padded, padded, 2.0 * share + steps, none, none)
    first, second = bt.first.reshape(shape) * 4.0, bt.second.reshape(shape) * 4.0
    copies = 1.0 if reduce_scatter_copies else 0.0
    # the last block's adapters open the layout: its backward fills the first bucket (with ODP the one before in
    # flight when the head's adapters filled a bucket of their own)
    at_block = first + (second if overlap_dp and plan.targeted(spec.head_layer()) else 0.0)
    alive = np.minimum(bt.count, window + 1 if overlap_dp else 1).reshape(shape) + copies
    # every adapter's gradient passes the sink's all-reduce over z before its bucket is reduce-scattered: at the end
    # of the backward all of the (small) buckets may be alive at once (measured on gpt-tiny 2x2x2x2: all of them)
    at_end = np.maximum(bt.largest.reshape(shape) * 4.0 * alive, padded)
    return LoraStatic(base + padded, share, 2.0 * share + steps, at_block, at_end)


def lora_block_activations(spec, plan: LoraPlan, gx, gy, mprime, act_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per token: (what the adapters of one block add to its saved bytes, what block 0 does not save) with flash
    attention (``memory.block_activation_bytes``' ``"flash"`` set), ``act_bytes`` b the compute dtype's bytes.

    Each adapter saves ``H [m', r]`` (b), and under autocast (b < 4) its casts of A and B and, when the layer reads
    a norm's fp32 output (QKV, MLP-up, the head), its own cast of that input ``[m', k/G_in]`` (the base saves
    another); otherwise its input is the storage the base saves. Block 0's input needs no gradient, so what the
    block saves before its first adapter is not saved: the norm, the layers and attention before it, and the base's
    cast of the first adapted layer's input (its adapter's cast stays)."""
    gx, gy = np.asarray(gx, dtype=np.int64), np.asarray(gy, dtype=np.int64)
    h, b = spec.hidden, act_bytes
    hx, hy = ceil_div(h, gx), ceil_div(h, gy)
    fy, Hy = ceil_div(4 * h, gy), ceil_div(spec.heads, gy)
    block = spec.block_layers()
    extra_token = np.zeros(np.broadcast_shapes(gx.shape, gy.shape))
    extra_fixed = np.zeros_like(extra_token, dtype=float)
    for layer in block:
        if not plan.targeted(layer):
            continue
        a, bb = adapter_elements(layer, plan.r, gx, gy)
        k_loc = ceil_div(layer.k, gy if layer.transposed else gx)
        extra_token = extra_token + plan.r * b + (k_loc * b if b < 4 and layer.norm else 0)
        extra_fixed = extra_fixed + ((a + bb) * b if b < 4 else 0)
    # one block's saved bytes per token in forward order, by the module that saves them (flash attention)
    saved = {"ln1": 4 * hx + 4, "qkv": b * hx, "attention": 3 * b * hy + 4 * Hy, "proj": b * hy,
             "ln2": 4 * hx + 4, "up": b * hx, "gelu": b * fy, "down": b * fy}
    first = next(layer for layer in block if plan.targeted(layer))
    order = list(saved)
    gone = sum(saved[n] for n in order[:order.index(first.name)])
    if b < 4 and first.norm:
        gone = gone + saved[first.name]
    mp = np.asarray(mprime, dtype=float)
    return mp * extra_token + extra_fixed, mp * gone


def dead_layers(spec, plan: LoraPlan) -> list[str]:
    """Block 0's FC layers whose input needs no gradient (before its first adapter, and that adapter's base): they
    have no backward, so they keep nothing (a kept gathered block is dropped after their forward)."""
    fc = {layer.name: layer for layer in spec.block_layers()}
    needs, _ = needs_input_grad(spec.block_modules(), fc, plan, False)
    return [name for name, need in zip(spec.block_modules(), needs) if name in fc and not need]


def check_lora_spec(spec, plan: LoraPlan) -> None:
    """perfmodel prices LoRA on a GPT block with at least one adapted block layer (one line otherwise)."""
    if not any(plan.targeted(layer) for layer in spec.block_layers()):
        raise PerfModelError(f"lora_targets={sorted(plan.targets)}: perfmodel prices LoRA with at least one block "
                             f"layer adapted ({', '.join(x.name for x in spec.block_layers())})")


def lora_head_activations(spec, plan: LoraPlan, gx, gy, mprime, act_bytes: int) -> np.ndarray:
    """What an adapter on the head adds to the head's saved bytes (0 when the head is not targeted): ``H``, and
    under autocast its casts of A, B and of ``ln_f``'s output."""
    head = spec.head_layer()
    if not plan.targeted(head):
        return np.zeros(np.broadcast_shapes(np.shape(gx), np.shape(gy), np.shape(mprime)))
    b = act_bytes
    a, bb = adapter_elements(head, plan.r, gx, gy)
    k_loc = ceil_div(head.k, np.asarray(gx, dtype=np.int64))
    per_token = plan.r * b + (k_loc * b if b < 4 else 0)
    return np.asarray(mprime, dtype=float) * per_token + ((a + bb) * b if b < 4 else 0)
