"""A Hugging Face decoder (Llama, Mistral, Qwen2, Qwen3, Gemma 3's text decoder, Phi-3) as perfmodel models it: the
FC layers of its plan (``axgrid.plans.hf``), the tensors one rank trains, every collective of its training step and
the parameter, gradient and optimizer bytes. Torch-free: the model is an ``axgrid.spec.TransformerShape`` of one of
``axgrid.spec.DECODER_FAMILIES``, read from a ``config.json`` (its FC layers: ``TransformerShape.block_layers``).

    spec = TransformerShape.from_config_json("path/to/config.json", seq=2048)
    events = decoder_collective_events(spec, (4, 4, 8, 64), tokens, 1, 2, recompute=True, grad_dtype_bytes=4)

The plan lays the model out like axgrid's GPT (``m'`` tokens per rank, ``h_x = h/Gx``, ``d`` the head size):

=========================  ==========================================================================================
q, k, v                    normal ``[H·d, h]``, ``[H_kv·d, h]``, ``[H_kv·d, h]`` (y splits whole heads), each its own
                           FC layer (AG_z of its block; forward AR_x of ``[m', n/Gy]``); biases for Qwen2 (and Llama's
                           ``attention_bias``)
Phi-3's qkv                one fused normal layer ``[(H + 2·H_kv)·d, h]``, each segment split over y on its own (the
                           same block and collectives as q, k, v's sum); its gate_up likewise ``[2f, h]``
o                          transposed ``[h, H·d]`` (a bias with Qwen3's and Gemma 3's ``attention_bias``)
gate, up, down             normal ``[f, h]`` twice, transposed ``[h, f]`` (biases with Llama's ``mlp_bias``)
RMSNorm (2 per layer; 4    forward AR_x of ``[m']``; backward AR_x of ``[m']`` and AR_z of the weight's gradient
for Gemma 3, its post      ``[h_x]`` (fp32: ``STAT_BYTES``)
norms after o and down;
and the final one)
q/k norms (Qwen3, Gemma 3) over each local head's ``d`` features: no forward collective; the weight's gradient ``[d]``
                           all-reduced over y, then over z (fp32)
token table                untied: ``[V, h_x]`` on every rank (features over x), its gradient AR_z'd (fp32); tied:
                           the head's weight itself, the lookup gathers the head's block over z and all-reduces
                           ``[m', h_x]`` over y in the forward (in the compute dtype: the runtime's lookup reads the
                           fp32 parameter when Gz = 1 and all-reduces fp32 there under bf16, not modelled here), and
                           reduce-scatters its gradient over z in the backward
loss                       the vocabulary-parallel cross entropy (AG_y of ``[m']``, AR_y of ``[m', 2]`` when Gy > 1)
                           and one AR_z of ``[sum, count]`` (fp32, when Gz > 1)
recompute                  per decoder layer (Hugging Face's gradient checkpointing): its forward again in backward
clipping (``clip``)        one all-reduce of the fp64 sum of squares over x·y·z (8 B), and over d with zero >= 1
=========================  ==========================================================================================

Element-wise work posts nothing: GeGLU/SwiGLU, Gemma's embedding scale and logit soft-capping, the rotary
embedding, sliding-window masks. The time of a step, the activations, the gathered blocks and the peak are
``perfmodel.model`` and ``perfmodel.memory``'s, for every family (the tensors listed here feed their buckets:
``perfmodel.parameters``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from axgrid.spec import DEFAULT_BUCKET_BYTES, TransformerShape, ceil_div

from .buckets import pack
from .comm import dp_events, fc_backward_events, fc_forward_events, layer_volumes, step_tail
from .context_parallel import step_events as cp_step_events
from .errors import PerfModelError
from .gpt import STAT_BYTES, GPTParam
from .lora import LoraPlan, adapter_backward_events, adapter_forward_events, adapter_tensors, lora_static_bytes

#: the head norms' module names (RMS norms over each head's ``head_dim`` features, after q_proj and k_proj)
HEAD_NORMS = ("q_norm", "k_norm")


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
    """The trainable tensors of one rank in ``model.parameters()`` order: the token table (tied: the head's weight
    shard), per layer its modules (:func:`layer_modules`: an FC layer's weight shard, then its bias; a head norm's
    ``[d]``, replicated; a hidden-width norm's ``[h/Gx]``), the final norm, the head's weight shard (untied)."""
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


def layer_groups(spec: TransformerShape) -> list[tuple[str, ...]]:
    """One decoder layer's modules by the input they read, in forward order: each norm alone (a post norm reads
    its layer's output), consecutive normal FC layers together (q, k and v read the same norm output; gate and up
    the same), each transposed one alone. A LoRA step's liveness walks these groups (:func:`_live_inputs`)."""
    groups: list[tuple[str, ...]] = []
    joins = False                        # whether the next normal layer reads the previous one's input
    for layer in spec.block_layers():
        if layer.norm:
            groups.append((layer.norm,))
            joins = False
        if joins and not layer.transposed:
            groups[-1] = groups[-1] + (layer.name,)
        else:
            groups.append((layer.name,))
        joins = not layer.transposed
        if layer.post_norm:
            groups.append((layer.post_norm,))
            joins = False
    return groups


def _live_inputs(groups: list[tuple[str, ...]], lora: Optional[LoraPlan],
                 live: bool) -> tuple[dict[str, bool], bool]:
    """Whether each module of a decoder layer (``groups``: :func:`layer_groups`) has an input that needs a
    gradient, given the layer's input does (``live``), and whether its output does: full training always; LoRA from
    the first adapter on (its group's other layers read the same input, which needs none in the layer where the
    first adapter sits)."""
    out: dict[str, bool] = {}
    for group in groups:
        for name in group:
            out[name] = live
        live = live or lora is None or any(lora.targeted(n) for n in group)
    return out, live


def decoder_step(spec: TransformerShape, grid: tuple[int, int, int, int], mprime: int, n_microbatches: int,
                 dtype_bytes: int, keep_gathered: bool = False, recompute: bool = False,
                 grad_dtype_bytes: Optional[int] = None, lora: Optional[LoraPlan] = None) -> list[tuple[str, str, int]]:
    """Every collective of the step but the data-parallel ones, as (dim, op, bytes) (module docstring); ``lora``: a
    LoRA step's (``perfmodel.lora``: the adapters' collectives, no frozen gradient reduced, no backward before the
    first adapter)."""
    gx, gy, gz, gd = (int(v) for v in grid)
    size = {"x": gx, "y": gy, "z": gz, "d": gd}
    b, gb = dtype_bytes, grad_dtype_bytes or dtype_bytes
    hx = ceil_div(spec.hidden, gx)
    layers = spec.block_layers()
    vols = [layer_volumes(layer, gx, gy, gz, mprime) for layer in layers]
    head = layer_volumes(spec.head_layer(), gx, gy, gz, mprime)
    ev: list[tuple[str, str, int]] = []

    def post(dim: str, op: str, nbytes: int) -> None:
        if size[dim] > 1 and nbytes > 0:
            ev.append((dim, op, int(nbytes)))

    def fc_fwd(v, layer: FCLayer) -> None:
        for e in fc_forward_events(v, b):
            post(*e)
        if lora is not None and lora.targeted(layer):
            for e in adapter_forward_events(layer, lora.r, mprime, b):
                post(*e)

    def fc_bwd(v, layer: FCLayer, live: bool = True) -> None:
        if lora is None:
            events = fc_forward_events(v, b)[:0 if keep_gathered else 1] + fc_backward_events(v, b, gb)
        else:                   # the frozen base: only the input gradient, where its input needs one
            events = (fc_forward_events(v, b)[:0 if keep_gathered else 1] + fc_backward_events(v, b, gb)[:1]
                      if live else [])
            if lora.targeted(layer):
                events = events + adapter_backward_events(layer, lora.r, gx, gy, mprime, b, gb)
        for e in events:
            post(*e)

    def norm_fwd() -> None:
        post("x", "all_reduce", mprime * STAT_BYTES)

    def norm_bwd(live: bool = True) -> None:
        if live:
            post("x", "all_reduce", mprime * STAT_BYTES)
        if lora is None:
            post("z", "all_reduce", hx * STAT_BYTES)

    def head_norms_bwd() -> None:                    # q_norm, k_norm: local statistics; dw [d] over y, then z
        if spec.head_norms and lora is None:
            for _ in HEAD_NORMS:
                post("y", "all_reduce", spec.head_dim * STAT_BYTES)
                post("z", "all_reduce", spec.head_dim * STAT_BYTES)

    def layer_fwd() -> None:
        for layer, v in zip(layers, vols):
            if layer.norm:
                norm_fwd()
            fc_fwd(v, layer)
            if layer.post_norm:
                norm_fwd()

    # with recompute, transformers' gradient checkpointing makes the layers' input need a gradient (measured: block
    # 0's norm and q, k, v post their input-gradient collectives under LoRA then), so only without it does LoRA skip
    # the backward before the first adapter
    lives, live, groups = [], lora is None or recompute, layer_groups(spec)
    for _ in range(spec.layers):
        needs, out = _live_inputs(groups, lora, live)
        lives.append((needs, live or out))
        live = out

    for _ in range(n_microbatches):
        if spec.tied:                                # the lookup reads the head's block
            post("z", "all_gather", head.padded * b)
            post("y", "all_reduce", mprime * hx * b)
        for _ in range(spec.layers):
            layer_fwd()
        norm_fwd()
        fc_fwd(head, spec.head_layer())
        if gy > 1:                                   # vocabulary-parallel cross entropy
            post("y", "all_gather", gy * mprime * STAT_BYTES)
            post("y", "all_reduce", 2 * mprime * STAT_BYTES)
        post("z", "all_reduce", 2 * STAT_BYTES)      # the loss's [sum, count] over z
        fc_bwd(head, spec.head_layer(), live)
        norm_bwd(live)
        for i in reversed(range(spec.layers)):
            needs, any_grad = lives[i]
            if not any_grad:
                continue
            if recompute:
                layer_fwd()
            for layer, v in reversed(list(zip(layers, vols))):
                if layer.post_norm and (needs[layer.post_norm] or lora is None):
                    norm_bwd(needs[layer.post_norm])
                if layer.attention:
                    head_norms_bwd()
                fc_bwd(v, layer, needs[layer.name])
                if layer.norm and (needs[layer.norm] or lora is None):
                    norm_bwd(needs[layer.norm])
        if lora is not None:
            continue                                 # the frozen table: no gradient
        if spec.tied:
            post("z", "reduce_scatter", head.padded * gb)
        else:
            post("z", "all_reduce", spec.vocab * hx * STAT_BYTES)
    return ev


def decoder_collective_events(spec: TransformerShape, grid: tuple[int, int, int, int], tokens_per_microbatch_global: int,
                              n_microbatches: int, dtype_bytes: int, keep_gathered: bool = False,
                              recompute: bool = False, grad_dtype_bytes: Optional[int] = None,
                              bucket_bytes: int = DEFAULT_BUCKET_BYTES, zero: int = 0,
                              clip: bool = False, lora: Optional[LoraPlan] = None, cp: int = 1,
                              cp_exchange: str = "all_gather") -> list[tuple[str, str, int]]:
    """Every collective of one training step as (dim, op, bytes): :func:`decoder_step`, then the data-parallel
    ones (:func:`perfmodel.comm.dp_events` over :func:`decoder_parameters` in the buckets' layout order), with
    ``clip`` the gradient clipping's norm between them (``perfmodel.comm.step_tail``); under context parallelism
    (``cp``) the sequences split over Gd·Gz/cp and the key-value exchange follows the micro-batches' events
    (:func:`perfmodel.context_parallel.step_events`)."""
    gx, gy, gz, gd = (int(v) for v in grid)
    seqs, rem = divmod(tokens_per_microbatch_global, spec.seq)
    if rem or seqs % max(gd * gz // cp, 1):
        raise PerfModelError(f"tokens per micro-batch {tokens_per_microbatch_global} are not whole sequences of "
                             f"{spec.seq} that split over Gd*Gz/cp={gd * gz // cp}")
    gb = grad_dtype_bytes or dtype_bytes
    ev = decoder_step(spec, grid, tokens_per_microbatch_global // (gd * gz), n_microbatches, dtype_bytes,
                      keep_gathered, recompute, gb, lora)
    ev += cp_step_events(spec, gy, tokens_per_microbatch_global // (gd * gz), n_microbatches, dtype_bytes, cp,
                         cp_exchange, recompute)
    sizes = decoder_dp_gradient_sizes(spec, grid, gb, lora)
    return ev + step_tail(dp_events(sizes, gd, gb, bucket_bytes, zero, n_microbatches), grid, zero, clip)


def decoder_dp_gradient_sizes(spec: TransformerShape, grid: tuple[int, int, int, int], grad_dtype_bytes: int,
                              lora: Optional[LoraPlan] = None) -> list[int]:
    """Bytes of each gradient the data-parallel buckets hold, in their layout order (reverse
    ``model.parameters()``: :func:`decoder_parameters`); with ``lora`` the adapters' only."""
    if lora is not None:                             # the adapters are all that is trained
        return [int(e) * grad_dtype_bytes for e in adapter_tensors(spec, lora, int(grid[0]), int(grid[1]))][::-1]
    return [p.elems * grad_dtype_bytes for p in decoder_parameters(spec, grid)][::-1]


def decoder_static_bytes(spec: TransformerShape, grid: tuple[int, int, int, int], zero: int = 0,
                         bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                         lora: Optional[LoraPlan] = None) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer) bytes of one rank, as ``perfmodel.memory.data_parallel_bytes`` prices the
    GPT's: fp32 parameters and gradients, AdamW's two moments and a 4-byte step per tensor; with ``zero`` >= 1 the
    buckets padded to Gd elements and this d-rank's share of the moments (and of the gradients with ``zero=2``).
    ``lora``: the frozen base's parameters and the adapters' (``perfmodel.lora.lora_static_bytes``)."""
    params = decoder_parameters(spec, grid)
    if lora is not None:
        st = lora_static_bytes(spec, lora, sum(p.elems for p in params), grid[0], grid[1], grid[3],
                               zero if grid[3] > 1 else 0, bucket_bytes, True, False, 0)
        return int(st.params), int(st.grads), int(st.optimizer)
    elems = sum(p.elems for p in params)
    steps = 4 * len(params)
    gd = int(grid[3])
    if zero == 0 or gd == 1:
        return 4 * elems, 4 * elems, 8 * elems + steps
    bt = pack([np.asarray([p.elems], dtype=np.int64) for p in params][::-1], 4, bucket_bytes, gd)
    padded, share = int(bt.padded[0]), int(bt.padded[0]) // gd
    return 4 * padded, 4 * (padded if zero == 1 else share), 8 * share + steps


__all__ = ["HEAD_NORMS", "decoder_dp_gradient_sizes", "decoder_parameters", "decoder_step", "layer_groups",
           "layer_modules",
           "decoder_collective_events", "decoder_static_bytes"]
