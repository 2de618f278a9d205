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
``perfmodel.parameters``). The replay of the step is ``perfmodel.step``'s, the GPT's too (the families differ in
its ``StepFamily``); ``decoder_collective_events`` and ``decoder_dp_gradient_sizes`` are its entry points under the
decoders' names, ``decoder_static_bytes`` the memory model's ``perfmodel.memory.static_bytes``.
"""
from __future__ import annotations

from .memory import static_bytes
from .parameters import HEAD_NORMS, decoder_parameters, layer_modules
from .step import layer_groups, step_collective_events, step_gradient_sizes

#: the decoders' names of the one replay's entry points (``perfmodel.step``) and of the memory model's static bytes
decoder_collective_events = step_collective_events
decoder_dp_gradient_sizes = step_gradient_sizes
decoder_static_bytes = static_bytes

__all__ = ["HEAD_NORMS", "decoder_dp_gradient_sizes", "decoder_parameters", "layer_groups", "layer_modules",
           "decoder_collective_events", "decoder_static_bytes"]
