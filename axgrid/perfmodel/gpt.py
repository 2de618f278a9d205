"""The GPT's training step as the runtime (``axgrid.models.gpt.GPT``) posts it: every collective, in order, and the
order in which gradients become final (which decides the data-parallel buckets under ODP). The replay is
``perfmodel.step``'s, one for every family; this is what the GPT's step holds (its ``StepFamily``: LayerNorm, a
learned position table, an untied head, the loss a sum).

Beyond the FC layers' own collectives (:mod:`perfmodel.comm`), per micro-batch, with ``m'`` tokens per GPU and
``h_x = h/Gx`` (all of these are fp32 in the runtime whatever the training dtype: ``STAT_BYTES``):

==========================  =====================================================================================
LayerNorm forward           2 AR_x of ``[m']`` (mean, then variance), for each of the 2L+1 layer norms (and the
                            2L of the blocks again in the recompute forward)
LayerNorm backward          AR_x of ``[m', 2]``; AR_z of the weight and bias gradients: one call of ``[2·h_x]``
                            (with ORS through the gradient pipeline)
embeddings backward         AR_z of the dense table gradients: the position table ``[S, h_x]`` first, then the
                            token table ``[V, h_x]`` (all rows, features over x)
cross entropy (forward)     AG_y of ``[m']`` (ledger: the output ``[Gy·m']``), AR_y of ``[m', 2]``; only when Gy > 1
loss (forward)              AR_z of one number; only when Gz > 1
==========================  =====================================================================================

Per step, the data-parallel mean over d reduces every trainable parameter (``model.parameters()`` order: token
table, position table, per block its modules' (``TransformerShape.block_modules``: ln1 w/b, QKV w/b, out w/b,
ln2 w/b, up w/b, down w/b); ln_f w/b; head weight) in buckets laid out in the reverse of that order
(``axgrid.spec.buckets``), in the gradient dtype: with ``zero=0`` an all-reduce per bucket; with ``zero`` >= 1 a
reduce-scatter per bucket padded to a multiple of Gd (in every micro-batch with ``zero=2``) and, after the
optimizer step, an all-gather of the parameters per bucket (fp32: ``PARAM_BYTES``). The buckets do not depend on
the overlap switches: with ODP a bucket is posted once all its gradients are final, in the backward. A step that
clips (``clip``) all-reduces the fp64 squared gradient norm (8 bytes) over the block "xyz" after that reduction, and
with ``zero`` >= 1 over d too (``perfmodel.comm.clip_events``).

``gpt_parameters`` (``perfmodel.parameters``), ``gpt_dp_gradient_sizes`` and ``gpt_collective_events`` are the
family-named entry points of ``perfmodel.parameters.trainable_parameters``, ``perfmodel.step.step_gradient_sizes``
and ``perfmodel.step.step_collective_events``.
"""
from __future__ import annotations

from .comm import PARAM_BYTES
from .parameters import GPTParam, gpt_parameters
from .step import STAT_BYTES, step_collective_events, step_gradient_sizes

#: the GPT's names of the one replay's entry points (``perfmodel.step``)
gpt_dp_gradient_sizes = step_gradient_sizes
gpt_collective_events = step_collective_events

__all__ = ["STAT_BYTES", "PARAM_BYTES", "GPTParam", "gpt_parameters", "gpt_dp_gradient_sizes",
           "gpt_collective_events"]
