"""One training step as the runtime posts it, for every block perfmodel prices (the GPT, ``axgrid.models.gpt``; the
Hugging Face decoders through their plans, ``axgrid.plans.hf``): every collective, in order, and the gradients the
data-parallel buckets reduce. One replay walks the shape's FC layers (``TransformerShape.block_layers``: each with
the norm before it and the post norm after it) and its head; what differs between the families is data
(:class:`StepFamily`), not a second walk: the GPT is a decoder whose norm is LayerNorm, MLP non-gated, positions a
learned table and head untied.

Per micro-batch, with ``m'`` tokens per GPU and ``h_x = h/Gx`` (the side collectives in fp32 whatever the training
dtype: :data:`STAT_BYTES`; docs/perfmodel.md#what-the-step-replay-posts-by-family says what each family posts):

===========================  ===================================================================================
tables, forward              a table tied to the head: the lookup gathers the head's block over z and all-reduces
                             ``[m', h_x]`` over y (compute dtype)
each block, forward          per FC layer: its norm (``norm_statistics`` AR_x of ``[m']``), the layer's forward
                             (AG_z of its block, the output's AR; a LoRA adapter's AR), its post norm
final norm, head, loss       the final norm, the head's forward, the vocabulary-parallel cross entropy (AG_y of
                             ``[m']``, AR_y of ``[m', 2]``; Gy > 1), the loss's AR_z (``loss_elements``)
head, final norm backward    the head's backward (AG_z again unless kept; input-gradient AR; RS_z of its
                             weight gradient), the norm's (AR_x of ``[m', norm_statistics]``; AR_z of its
                             ``norm_parameters`` gradients ``[h_x]`` in one call)
each block, backward         (reverse) with recompute the block's forward again, then per FC layer in reverse:
                             its post norm, the head norms' gradients before the attention's layer (Qwen3,
                             Gemma 3: AR_y then AR_z of ``[d]`` each), the layer's backward, its norm
tables, backward             the GPT's position table's AR_z ``[S, h_x]``; the token table's AR_z ``[V, h_x]``, or
                             tied, the RS_z of the head's block (grad dtype)
===========================  ===================================================================================

Then the data-parallel collectives of :func:`step_gradient_sizes` (``perfmodel.comm.dp_events``) and the clipping's
(``perfmodel.comm.step_tail``). With LoRA (``perfmodel.lora``) only the adapters' gradients are reduced, and a
module whose input needs no gradient (before the first adapter) has no backward (:func:`block_liveness`).

What one block posts is :meth:`StepReplay.block_forward` and :meth:`StepReplay.block_backward`: the place to add
a block's further collectives (a mixture of experts' routed experts: :meth:`StepReplay.experts`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from axgrid.spec import DEFAULT_BUCKET_BYTES, FCLayer, TransformerShape, ceil_div

from .comm import STAT_BYTES, dp_events, fc_backward_events, fc_forward_events, layer_volumes, step_tail
from .context_parallel import step_events as cp_step_events
from .errors import PerfModelError
from .lora import LoraPlan, adapter_backward_events, adapter_forward_events, adapter_tensors
from .moe import expert_dp_events, moe_layer_events
from .parameters import HEAD_NORMS, trainable_parameters

Event = tuple[str, str, int]


class StepFamily(NamedTuple):
    """What the families' steps differ in, beyond their FC layers (``TransformerShape.block_layers``):
    ``norm_statistics``: the per-token statistics a norm all-reduces over x (a LayerNorm's mean and variance: 2; an
    RMSNorm's mean square: 1); ``norm_parameters``: its ``[h_x]`` vectors (weight and bias: 2; weight: 1);
    ``position_rows``: rows of a learned position table (the GPT's ``S``; 0: rotary positions); ``tied``: the
    token table is the head's weight; ``loss_elements``: the loss's all-reduce over z (the GPT's sum: 1; a
    decoder's ``[sum, count]``: 2); ``head_norms``: q and k norms over each head's ``head_dim`` features;
    ``checkpoint_needs_input_grad``: recompute makes every layer's input need a gradient (Hugging Face's gradient
    checkpointing, measured: under LoRA block 0's norm and first layers then post their input-gradient
    collectives; the GPT's own checkpoint does not)."""

    norm_statistics: int
    norm_parameters: int
    position_rows: int
    tied: bool
    loss_elements: int
    head_norms: bool
    checkpoint_needs_input_grad: bool


def step_family(spec: TransformerShape) -> StepFamily:
    """The :class:`StepFamily` of ``spec``."""
    return StepFamily(norm_statistics=2 if spec.norm_kind == "layernorm" else 1,
                      norm_parameters=spec.norm_parameters, position_rows=spec.seq if spec.is_gpt else 0,
                      tied=spec.tied, loss_elements=1 if spec.is_gpt else 2, head_norms=spec.head_norms,
                      checkpoint_needs_input_grad=not spec.is_gpt)


def loss_elements(spec: TransformerShape) -> int:
    """fp32 elements of the loss's all-reduce over z (:class:`StepFamily`)."""
    return step_family(spec).loss_elements


def norm_volumes(spec: TransformerShape, mp_int, hx) -> tuple[int, object, object, object]:
    """(forward AR_x calls, elements of each, backward AR_x elements, gradient AR_z elements) of one norm of
    ``spec`` with ``mp_int`` tokens and ``hx`` features per rank (scalars or arrays)."""
    fam = step_family(spec)
    return fam.norm_statistics, mp_int, fam.norm_statistics * mp_int, fam.norm_parameters * hx


def table_events(spec: TransformerShape, mp_int, hx, head_padded, dtype_bytes: int,
                 grad_bytes: int) -> tuple[list[tuple[str, str, object]], list[tuple[str, str, object]]]:
    """(forward, backward) collectives of the embedding tables in one micro-batch as (dim, op, bytes): a table
    tied to the head reads its padded block ``head_padded`` (AG_z, then AR_y of the lookup's ``[m', h_x]``, in
    ``dtype_bytes``) and reduce-scatters its gradient over z (``grad_bytes``); else the position table's (when
    learned) and the token table's gradients are all-reduced over z (fp32)."""
    fam = step_family(spec)
    if fam.tied:
        return ([("z", "all_gather", head_padded * dtype_bytes), ("y", "all_reduce", mp_int * hx * dtype_bytes)],
                [("z", "reduce_scatter", head_padded * grad_bytes)])
    rows = ([fam.position_rows] if fam.position_rows else []) + [spec.vocab]
    return [], [("z", "all_reduce", r * hx * STAT_BYTES) for r in rows]


def layer_groups(spec: TransformerShape) -> list[tuple[str, ...]]:
    """One block's modules by the input they read, in forward order: each norm alone (a post norm reads its
    layer's output), consecutive normal FC layers together (q, k and v read the same norm output; gate and up the
    same), each transposed one alone. A LoRA step's liveness walks these groups (:func:`block_liveness`)."""
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


def block_liveness(spec: TransformerShape, lora: Optional[LoraPlan],
                   recompute: bool) -> tuple[list[tuple[dict[str, bool], bool]], bool]:
    """Per block: (whether each module's input needs a gradient, whether any of the block's modules does), and
    whether the head's input does. Full training: always. LoRA: from the first adapter on (its group's other layers
    read the same input, which needs none in the block where the first adapter sits), or everywhere when recompute
    makes the layers' inputs need one (:class:`StepFamily`)."""
    live = lora is None or (recompute and step_family(spec).checkpoint_needs_input_grad)
    groups, blocks = layer_groups(spec), []
    for _ in range(spec.layers):
        needs, block_in = {}, live
        for group in groups:
            for name in group:
                needs[name] = live
            live = live or lora is None or any(lora.targeted(n) for n in group)
        blocks.append((needs, block_in or live))
    return blocks, live


class StepReplay:
    """The collectives one rank posts in a step but the data-parallel ones, appended to ``events`` by the methods
    (module docstring); a dimension of size 1 and an empty call post nothing. ``mprime``: tokens per GPU per
    micro-batch."""

    def __init__(self, spec: TransformerShape, grid: tuple[int, int, int, int], mprime: int, dtype_bytes: int,
                 keep_gathered: bool = False, grad_dtype_bytes: Optional[int] = None,
                 lora: Optional[LoraPlan] = None, ep: int = 1) -> None:
        self.spec, self.family, self.lora, self.keep_gathered = spec, step_family(spec), lora, keep_gathered
        self.grid, self.ep = tuple(int(v) for v in grid), int(ep)
        self.gx, self.gy, self.gz, self.gd = (int(v) for v in grid)
        self.size = {"x": self.gx, "y": self.gy, "z": self.gz, "d": self.gd, "e": self.ep}      # "e": the expert-parallel group
        self.mprime, self.b, self.gb = int(mprime), dtype_bytes, grad_dtype_bytes or dtype_bytes
        self.hx = ceil_div(spec.hidden, self.gx)
        self.layers = spec.block_layers()
        self.head = spec.head_layer()
        self.vol = {layer.name: layer_volumes(layer, self.gx, self.gy, self.gz, self.mprime)
                    for layer in self.layers + [self.head]}
        self.events: list[Event] = []

    def post(self, events) -> None:
        for dim, op, nbytes in events:
            if self.size[dim] > 1 and nbytes > 0:
                self.events.append((dim, op, int(nbytes)))

    # -- the pieces -----------------------------------------------------------------------------------------
    def fc_forward(self, layer: FCLayer) -> None:
        self.post(fc_forward_events(self.vol[layer.name], self.b))
        if self.lora is not None and self.lora.targeted(layer):
            self.post(adapter_forward_events(layer, self.lora.r, self.mprime, self.b))

    def fc_backward(self, layer: FCLayer, live: bool = True) -> None:
        """The layer's backward; ``live``: its input needs a gradient (else a frozen base has none)."""
        v = self.vol[layer.name]
        regather = fc_forward_events(v, self.b)[:0 if self.keep_gathered else 1]
        if self.lora is None:
            self.post(regather + fc_backward_events(v, self.b, self.gb, layer.bias))
            return
        # the frozen base: only the input gradient (its block gathered again unless kept)
        self.post(regather + fc_backward_events(v, self.b, self.gb)[:1] if live else [])
        if self.lora.targeted(layer):
            self.post(adapter_backward_events(layer, self.lora.r, self.gx, self.gy, self.mprime, self.b, self.gb))

    def norm_forward(self) -> None:
        self.post([("x", "all_reduce", self.mprime * STAT_BYTES)] * self.family.norm_statistics)

    def norm_backward(self, live: bool = True) -> None:
        if live:
            self.post([("x", "all_reduce", self.family.norm_statistics * self.mprime * STAT_BYTES)])
        if self.lora is None:                        # the weight (and bias) gradients in one call
            self.post([("z", "all_reduce", self.family.norm_parameters * self.hx * STAT_BYTES)])

    def head_norms_backward(self) -> None:
        """q_norm, k_norm: local statistics; each weight's gradient ``[d]`` over y, then z."""
        if self.family.head_norms and self.lora is None:
            for width in self.spec.head_norm_widths():
                self.post([("y", "all_reduce", width * STAT_BYTES), ("z", "all_reduce", width * STAT_BYTES)])

    def tables(self, forward: bool) -> None:
        fwd, bwd = table_events(self.spec, self.mprime, self.hx, self.vol[self.head.name].padded, self.b, self.gb)
        self.post(fwd if forward else bwd)

    def experts(self, forward: bool) -> None:
        """A mixture of experts' routed experts with EP size ``ep`` (``perfmodel.moe.moe_layer_events``: the router,
        the dispatch and combine all-to-alls, each local expert's 3D layers); nothing for a dense block."""
        if self.spec.is_moe:
            self.post(moe_layer_events(self.spec, self.grid, self.ep, self.mprime, self.b, self.gb,
                                       self.keep_gathered, forward))

    def loss(self) -> None:
        if self.gy > 1:                              # vocabulary-parallel cross entropy
            self.post([("y", "all_gather", self.gy * self.mprime * STAT_BYTES),
                       ("y", "all_reduce", 2 * self.mprime * STAT_BYTES)])
        self.post([("z", "all_reduce", self.family.loss_elements * STAT_BYTES)])

    # -- one block ------------------------------------------------------------------------------------------
    def block_forward(self) -> None:
        """What one block posts in its forward (and again in its recompute)."""
        for layer in self.layers:
            if layer.norm:
                self.norm_forward()
            self.fc_forward(layer)
            if layer.post_norm:
                self.norm_forward()
        self.experts(forward=True)

    def block_backward(self, needs: dict[str, bool]) -> None:
        """What one block posts in its backward; ``needs``: whether each module's input needs a gradient."""
        full = self.lora is None
        self.experts(forward=False)
        for layer in reversed(self.layers):
            if layer.post_norm and (needs[layer.post_norm] or full):
                self.norm_backward(needs[layer.post_norm])
            if layer.attention:
                self.head_norms_backward()
            self.fc_backward(layer, needs[layer.name])
            if layer.norm and (needs[layer.norm] or full):
                self.norm_backward(needs[layer.norm])

    # -- the step -------------------------------------------------------------------------------------------
    def microbatch(self, recompute: bool, blocks: list[tuple[dict[str, bool], bool]], head_live: bool) -> None:
        """One micro-batch's forward and backward (``blocks``, ``head_live``: :func:`block_liveness`)."""
        self.tables(forward=True)
        for _ in range(self.spec.layers):
            self.block_forward()
        self.norm_forward()
        self.fc_forward(self.head)
        self.loss()
        self.fc_backward(self.head, head_live)
        self.norm_backward(head_live)
        for needs, any_grad in reversed(blocks):
            if not any_grad:                         # nothing in the block needs a gradient: no backward at all
                continue
            if recompute:
                self.block_forward()
            self.block_backward(needs)
        if self.lora is None:                        # a frozen table has no gradient
            self.tables(forward=False)


def step_events(spec: TransformerShape, grid: tuple[int, int, int, int], mprime: int, n_microbatches: int,
                dtype_bytes: int, keep_gathered: bool = False, recompute: bool = False,
                grad_dtype_bytes: Optional[int] = None, lora: Optional[LoraPlan] = None, ep: int = 1) -> list[Event]:
    """Every collective of the step but the data-parallel ones, as (dim, op, bytes) in posting order (module
    docstring). ``mprime``: tokens per GPU per micro-batch; ``lora``: the adapters of a LoRA step; ``ep``: a mixture
    of experts' expert-parallel size."""
    replay = StepReplay(spec, grid, mprime, dtype_bytes, keep_gathered, grad_dtype_bytes, lora, ep)
    blocks, head_live = block_liveness(spec, lora, recompute)
    for _ in range(n_microbatches):
        replay.microbatch(recompute, blocks, head_live)
    return replay.events


def step_gradient_sizes(spec: TransformerShape, grid: tuple[int, int, int, int], grad_dtype_bytes: int,
                        lora: Optional[LoraPlan] = None) -> list[int]:
    """Bytes of each gradient the data-parallel buckets hold, in their layout order (reverse
    ``model.parameters()``: ``perfmodel.parameters.trainable_parameters``); with ``lora`` the adapters' only."""
    if lora is not None:                             # the adapters are all that is trained
        return [int(e) * grad_dtype_bytes for e in adapter_tensors(spec, lora, int(grid[0]), int(grid[1]))][::-1]
    return [p.elems * grad_dtype_bytes for p in trainable_parameters(spec, grid)][::-1]


def step_collective_events(spec: TransformerShape, grid: tuple[int, int, int, int], tokens_per_microbatch_global: int,
                           n_microbatches: int, dtype_bytes: int, keep_gathered: bool = False,
                           recompute: bool = False, grad_dtype_bytes: Optional[int] = None,
                           bucket_bytes: int = DEFAULT_BUCKET_BYTES, zero: int = 0, clip: bool = False,
                           lora: Optional[LoraPlan] = None, ep: int = 1, cp: int = 1,
                           cp_exchange: str = "all_gather") -> list[Event]:
    """Every collective of one training step as (group, op, bytes): the micro-batches' forward and backward
    (:func:`step_events`), then the data-parallel ones (``perfmodel.comm.dp_events`` over
    :func:`step_gradient_sizes`; listed last even where they are posted during the backward), with ``clip`` the
    clipping's norm all-reduces among them (``perfmodel.comm.step_tail``). ``tokens_per_microbatch_global`` must be
    whole sequences that split over Gd·Gz (z splits by sequence; over Gd·Gz/cp under context parallelism, whose
    key-value exchange over "c" follows the micro-batches' events: ``perfmodel.context_parallel.step_events``). A mixture of experts' expert gradients are reduced
    over their replicas after the dense ones (``perfmodel.moe.expert_dp_events``; ``ep``: the expert-parallel
    size)."""
    gx, gy, gz, gd = (int(v) for v in grid)
    if min(gx, gy, gz, gd) <= 0:
        raise PerfModelError(f"grid sizes must be positive, got {grid}")
    seqs, rem = divmod(tokens_per_microbatch_global, spec.seq)
    if rem or seqs % max(gd * gz // cp, 1):
        raise PerfModelError(f"tokens per micro-batch {tokens_per_microbatch_global} are not whole sequences of "
                             f"{spec.seq} that split over Gd*Gz/cp={gd * gz // cp}")
    gb = grad_dtype_bytes or dtype_bytes
    mprime = tokens_per_microbatch_global // (gd * gz)
    ev = step_events(spec, grid, mprime, n_microbatches, dtype_bytes, keep_gathered, recompute, gb, lora, ep)
    ev += cp_step_events(spec, gy, mprime, n_microbatches, dtype_bytes, cp, cp_exchange, recompute)
    dp = dp_events(step_gradient_sizes(spec, grid, gb, lora), gd, gb, bucket_bytes, zero, n_microbatches)
    experts = expert_dp_events(spec, grid, ep, gb, zero, n_microbatches, bucket_bytes) if spec.is_moe else []
    tail = step_tail(dp + experts, grid, zero, clip)
    if clip and spec.is_moe and ep > 1 and not zero:     # the experts' squared norms summed over "e" (one fp64)
        first = next((i for i, e in enumerate(tail) if e[0] == "xyz"), len(tail))
        tail.insert(first, ("e", "all_reduce", 8))
    return ev + tail


__all__ = ["STAT_BYTES", "StepFamily", "StepReplay", "block_liveness", "layer_groups", "loss_elements",
           "norm_volumes", "step_collective_events", "step_events", "step_family", "step_gradient_sizes",
           "table_events"]
