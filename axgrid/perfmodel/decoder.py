"""A Hugging Face decoder of the Llama structure (Llama, Mistral, Qwen2) as perfmodel models it: the FC layers of
its plan (``axgrid.plans.hf``), the tensors one rank trains, every collective of its training step and the
parameter, gradient and optimizer bytes. Torch-free: the spec is read from a ``config.json``.

    spec = DecoderSpec.from_config("path/to/config.json", seq=2048)
    events = decoder_collective_events(spec, (4, 4, 8, 64), tokens, 1, 2, recompute=True, grad_dtype_bytes=4)

The plan lays the model out like axgrid's GPT (``m'`` tokens per rank, ``h_x = h/Gx``, ``d`` the head size):

=========================  ==========================================================================================
q, k, v                    normal ``[H·d, h]``, ``[H_kv·d, h]``, ``[H_kv·d, h]`` (y splits whole heads), each its own
                           FC layer (AG_z of its block; forward AR_x of ``[m', n/Gy]``); biases for Qwen2 (and Llama's
                           ``attention_bias``)
o                          transposed ``[h, H·d]``
gate, up, down             normal ``[f, h]`` twice, transposed ``[h, f]`` (biases with Llama's ``mlp_bias``)
RMSNorm (2 per layer, and  forward AR_x of ``[m']``; backward AR_x of ``[m']`` and AR_z of the weight's gradient
the final one)             ``[h_x]`` (fp32: ``STAT_BYTES``)
token table                untied: ``[V, h_x]`` on every rank (features over x), its gradient AR_z'd (fp32); tied:
                           the head's weight itself, the lookup gathers the head's block over z and all-reduces
                           ``[m', h_x]`` over y in the forward, and reduce-scatters its gradient over z in the backward
loss                       the vocabulary-parallel cross entropy (AG_y of ``[m']``, AR_y of ``[m', 2]`` when Gy > 1)
                           and one AR_z of ``[sum, count]`` (fp32, when Gz > 1)
recompute                  per decoder layer (Hugging Face's gradient checkpointing): its forward again in backward
clipping (``clip``)        one all-reduce of the fp64 sum of squares over x·y·z (8 B), and over d with zero >= 1
=========================  ==========================================================================================

Not modelled (a dry run says so rather than compare with the GPT's formulas): the activations a SwiGLU/GQA block
saves, the gathered weight blocks, the temporaries and so the peak; the time of a step (perfmodel ranks grids for
the GPT only).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from axgrid.spec import DEFAULT_BUCKET_BYTES, FCLayer, ceil_div

from .buckets import pack
from .comm import dp_events, fc_backward_events, fc_forward_events, layer_volumes, step_tail
from .errors import PerfModelError
from .gpt import STAT_BYTES, GPTParam
from .lora import LoraPlan, adapter_backward_events, adapter_forward_events, adapter_tensors, lora_static_bytes

#: ``model_type`` of a config.json -> the families modelled here (``axgrid.plans.hf``'s Llama plan serves them)
FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
#: what perfmodel does not model for these families (the dry run prints it beside the figures)
NOT_MODELLED = ("activations", "gathered", "temporaries", "peak")


@dataclass(frozen=True)
class DecoderSpec:
    """A decoder of the Llama structure: ``layers`` × (RMSNorm, q/k/v, attention on local heads, o, RMSNorm,
    gate/up, SwiGLU, down), a final RMSNorm and the LM head (``tied`` to the token table or not); ``path``: the
    config.json it was read from (the runtime builds the model from it)."""

    name: str
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    seq: int
    tied: bool
    attention_bias: bool = False      # q, k, v (and o with Llama's attention_bias) carry biases
    output_bias: bool = False         # o carries a bias (Llama's attention_bias)
    mlp_bias: bool = False
    path: str = ""

    @staticmethod
    def from_config(path: str, seq: int) -> "DecoderSpec":
        """The spec of the config.json at ``path`` (or in the folder ``path``) trained on ``seq``-token sequences;
        a family not modelled here, or a config without the sizes, raises :class:`PerfModelError` in one line."""
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise PerfModelError(f"{path}: no such config.json; give a Hugging Face config.json (or its folder)")
        try:
            with open(file) as f:
                c: dict[str, Any] = json.load(f)
        except (OSError, ValueError) as e:
            raise PerfModelError(f"{file}: not a readable JSON config ({e})") from None
        family = c.get("model_type")
        if family not in FAMILIES:
            raise PerfModelError(f"{file}: model_type {family!r} ({', '.join(c.get('architectures') or [])}) is not "
                                 f"a family the dry run models; use a config of {', '.join(sorted(FAMILIES))} "
                                 f"(Llama-structured decoders) or a named GPT size")
        need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [k for k in need if not isinstance(c.get(k), int)]
        if missing:
            raise PerfModelError(f"{file}: {', '.join(missing)} missing or not an integer; a {family} config.json "
                                 f"states them")
        h, heads = c["hidden_size"], c["num_attention_heads"]
        kv = c.get("num_key_value_heads") or heads
        d = c.get("head_dim") or h // heads
        attn_bias = family == "qwen2" or bool(c.get("attention_bias", False))
        stem = os.path.splitext(os.path.basename(file))[0]
        name = os.path.basename(os.path.dirname(os.path.abspath(file))) if stem == "config" else stem
        spec = DecoderSpec(str(name), family, c["num_hidden_layers"], h, heads, kv, d, c["intermediate_size"],
                           c["vocab_size"], seq, bool(c.get("tie_word_embeddings", False)), attn_bias,
                           family == "llama" and attn_bias, bool(c.get("mlp_bias", False)) and family == "llama",
                           os.path.abspath(file))
        if heads % kv:
            raise PerfModelError(f"{file}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        if not isinstance(seq, int) or seq < 1:
            raise PerfModelError(f"sequence length {seq!r}: give a positive --seq")
        return spec

    def block_layers(self) -> list[FCLayer]:
        """One decoder layer's FC layers in forward order: q, k, v, o, gate, up, down."""
        h, f, qd, kvd = self.hidden, self.ffn, self.heads * self.head_dim, self.kv_heads * self.head_dim
        ab, mb = self.attention_bias, self.mlp_bias
        return [FCLayer(qd, h, False, ab, "q_proj", norm="input_layernorm", attention=True),
                FCLayer(kvd, h, False, ab, "k_proj"), FCLayer(kvd, h, False, ab, "v_proj"),
                FCLayer(h, qd, True, self.output_bias, "o_proj"),
                FCLayer(f, h, False, mb, "gate_proj", norm="post_attention_layernorm"),
                FCLayer(f, h, False, mb, "up_proj"), FCLayer(h, f, True, mb, "down_proj")]

    def head_layer(self) -> FCLayer:
        """The LM head ``[V, h]`` after the final norm, no bias, never recomputed."""
        return FCLayer(self.vocab, self.hidden, False, False, "lm_head", recompute=False, norm="norm")

    def divisibility(self, grid: tuple[int, int, int, int]) -> list[str]:
        """What of the model does not divide ``grid`` (the plan's rules, ``axgrid.plans.transformer.resolve``), each
        naming the value and the dimension; [] when it fits."""
        gx, gy = grid[0], grid[1]
        rules = [("hidden_size", self.hidden, gx, "x"), ("num_attention_heads", self.heads, gy, "y"),
                 ("num_key_value_heads", self.kv_heads, gy, "y"), ("intermediate_size", self.ffn, gy, "y"),
                 ("vocab_size", self.vocab, gy, "y")]
        return [f"{what} {value} not divisible by G{dim}={g}" for what, value, g, dim in rules if value % g]


def decoder_parameters(spec: DecoderSpec, grid: tuple[int, int, int, int]) -> list[GPTParam]:
    """The trainable tensors of one rank in ``model.parameters()`` order: the token table (tied: the head's weight
    shard), per layer q, k, v, o, gate, up, down (weight shard, then bias) and the two norms, the final norm, the
    head's weight shard (untied)."""
    gx, gy, gz, _ = (int(v) for v in grid)
    hx = ceil_div(spec.hidden, gx)
    head = int(layer_volumes(spec.head_layer(), gx, gy, gz, 1).shard)
    out = [GPTParam("embed_tokens", head, "fc_w") if spec.tied else GPTParam("embed_tokens", spec.vocab * hx, "emb")]
    layers = spec.block_layers()
    vols = [layer_volumes(layer, gx, gy, gz, 1) for layer in layers]
    for i in range(spec.layers):
        for layer, v in zip(layers, vols):
            out.append(GPTParam(f"l{i}.{layer.name}.w", int(v.shard), "fc_w"))
            if layer.bias:
                out.append(GPTParam(f"l{i}.{layer.name}.b", int(v.bias_loc), "fc_b"))
        out += [GPTParam(f"l{i}.input_layernorm", hx, "ln"), GPTParam(f"l{i}.post_attention_layernorm", hx, "ln")]
    out.append(GPTParam("norm", hx, "ln"))
    if not spec.tied:
        out.append(GPTParam("lm_head", head, "fc_w"))
    return out


#: one decoder layer's modules by the input they read, in forward order (q, k and v read the same norm output;
#: gate and up the same): a LoRA step's liveness walks these groups (:func:`_live_inputs`)
LAYER_GROUPS = (("input_layernorm",), ("q_proj", "k_proj", "v_proj"), ("o_proj",), ("post_attention_layernorm",),
                ("gate_proj", "up_proj"), ("down_proj",))


def _live_inputs(lora: Optional[LoraPlan], live: bool) -> tuple[dict[str, bool], bool]:
    """Whether each module of a decoder layer has an input that needs a gradient, given the layer's input does
    (``live``), and whether its output does: full training always; LoRA from the first adapter on (its group's
    other layers read the same input, which needs none in the layer where the first adapter sits)."""
    out: dict[str, bool] = {}
    for group in LAYER_GROUPS:
        for name in group:
            out[name] = live
        live = live or lora is None or any(lora.targeted(n) for n in group)
    return out, live


def decoder_step(spec: DecoderSpec, grid: tuple[int, int, int, int], mprime: int, n_microbatches: int,
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

    def layer_fwd() -> None:
        for layer, v in zip(layers, vols):
            if layer.norm:
                norm_fwd()
            fc_fwd(v, layer)

    # with recompute, transformers' gradient checkpointing makes the layers' input need a gradient (measured: block
    # 0's norm and q, k, v post their input-gradient collectives under LoRA then), so only without it does LoRA skip
    # the backward before the first adapter
    lives, live = [], lora is None or recompute
    for _ in range(spec.layers):
        needs, out = _live_inputs(lora, live)
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


def decoder_collective_events(spec: DecoderSpec, grid: tuple[int, int, int, int], tokens_per_microbatch_global: int,
                              n_microbatches: int, dtype_bytes: int, keep_gathered: bool = False,
                              recompute: bool = False, grad_dtype_bytes: Optional[int] = None,
                              bucket_bytes: int = DEFAULT_BUCKET_BYTES, zero: int = 0,
                              clip: bool = False, lora: Optional[LoraPlan] = None) -> list[tuple[str, str, int]]:
    """Every collective of one training step as (dim, op, bytes): :func:`decoder_step`, then the data-parallel
    ones (:func:`perfmodel.comm.dp_events` over :func:`decoder_parameters` in the buckets' layout order), with
    ``clip`` the gradient clipping's norm between them (``perfmodel.comm.step_tail``)."""
    gx, gy, gz, gd = (int(v) for v in grid)
    seqs, rem = divmod(tokens_per_microbatch_global, spec.seq)
    if rem or seqs % (gd * gz):
        raise PerfModelError(f"tokens per micro-batch {tokens_per_microbatch_global} are not whole sequences of "
                             f"{spec.seq} that split over Gd*Gz={gd * gz}")
    gb = grad_dtype_bytes or dtype_bytes
    ev = decoder_step(spec, grid, tokens_per_microbatch_global // (gd * gz), n_microbatches, dtype_bytes,
                      keep_gathered, recompute, gb, lora)
    if lora is not None:                             # the adapters are all that is trained
        sizes = [int(e) * gb for e in adapter_tensors(spec, lora, gx, gy)][::-1]
    else:
        sizes = [p.elems * gb for p in decoder_parameters(spec, grid)][::-1]
    return ev + step_tail(dp_events(sizes, gd, gb, bucket_bytes, zero, n_microbatches), grid, zero, clip)


def decoder_static_bytes(spec: DecoderSpec, grid: tuple[int, int, int, int], zero: int = 0,
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


__all__ = ["FAMILIES", "NOT_MODELLED", "DecoderSpec", "decoder_parameters", "decoder_step",
           "decoder_collective_events", "decoder_static_bytes"]
