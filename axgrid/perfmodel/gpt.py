"""The whole GPT training step as the runtime (``axgrid.models.gpt.GPT``) posts it: every collective, in order,
and the order in which gradients become final (which decides the data-parallel buckets under ODP).

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
"""
from __future__ import annotations

from typing import NamedTuple

from axgrid.spec import DEFAULT_BUCKET_BYTES, TransformerShape, ceil_div

from .comm import PARAM_BYTES, dp_events, fc_backward_events, fc_forward_events, layer_volumes, step_tail
from .context_parallel import step_events as cp_step_events
from .errors import PerfModelError
from .lora import LoraPlan, adapter_backward_events, adapter_forward_events, adapter_tensors, needs_input_grad

#: Bytes per element of the runtime's fp32 side collectives (layer-norm statistics and parameter gradients,
#: cross-entropy reductions, the loss, the embedding gradients over z).
STAT_BYTES = 4


class GPTParam(NamedTuple):
    """One trainable tensor of the GPT on one rank: ``key`` (e.g. "b3.up.w"), elements on this rank, and
    ``kind``: "fc_w", "fc_b", "ln" or "emb"."""

    key: str
    elems: int
    kind: str


def gpt_parameters(spec: TransformerShape, grid: tuple[int, int, int, int]) -> list[GPTParam]:
    """The trainable tensors of one rank in ``model.parameters()`` order (zero-size tensors left out)."""
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


def gpt_step(spec: TransformerShape, grid: tuple[int, int, int, int], mprime: int, n_microbatches: int,
             dtype_bytes: int, keep_gathered: bool = False, recompute: bool = False,
             grad_dtype_bytes: int | None = None, lora: LoraPlan | None = None) -> list[tuple[str, str, int]]:
    """Every collective of the step but the data-parallel ones, as (dim, op, bytes) in posting order.
    ``mprime``: tokens per GPU per micro-batch. ``lora``: the adapters of a LoRA step (:mod:`perfmodel.lora`: the
    adapters' collectives; no weight, bias, norm or table gradient reduced over z; no backward before the first
    adapter)."""
    gx, gy, gz, gd = (int(v) for v in grid)
    size = {"x": gx, "y": gy, "z": gz, "d": gd}
    b, gb = dtype_bytes, grad_dtype_bytes or dtype_bytes
    hx = ceil_div(spec.hidden, gx)
    fc = {L.name: L for L in spec.block_layers()}
    blk = {name: layer_volumes(L, gx, gy, gz, mprime) for name, L in fc.items()}
    head = layer_volumes(spec.head_layer(), gx, gy, gz, mprime)
    modules = spec.block_modules()
    ev: list[tuple[str, str, int]] = []

    def post(dim: str, op: str, nbytes: int) -> None:
        if size[dim] > 1 and nbytes > 0:
            ev.append((dim, op, int(nbytes)))

    def fc_fwd(v, name: str) -> None:
        for e in fc_forward_events(v, b):
            post(*e)
        if lora is not None and lora.targeted(name):
            for e in adapter_forward_events(layer_of[name], lora.r, mprime, b):
                post(*e)

    def fc_bwd(v, bias: bool, name: str, live: bool = True) -> None:
        """The layer's backward; ``live``: its input needs a gradient (else a frozen base has none)."""
        if lora is None:
            events = fc_forward_events(v, b)[:0 if keep_gathered else 1] + fc_backward_events(v, b, gb, bias)
        else:                   # the frozen base: only the input gradient (its block gathered again unless kept)
            events = (fc_forward_events(v, b)[:0 if keep_gathered else 1] + fc_backward_events(v, b, gb)[:1]
                      if live else [])
            if lora.targeted(name):
                events = events + adapter_backward_events(layer_of[name], lora.r, gx, gy, mprime, b, gb)
        for e in events:
            post(*e)

    def ln_fwd() -> None:
        post("x", "all_reduce", mprime * STAT_BYTES)
        post("x", "all_reduce", mprime * STAT_BYTES)

    def ln_bwd(live: bool = True) -> None:
        if live:
            post("x", "all_reduce", 2 * mprime * STAT_BYTES)
        if lora is None:
            post("z", "all_reduce", 2 * hx * STAT_BYTES)       # weight and bias in one call

    def block_fwd() -> None:
        for name in modules:
            if name in blk:
                fc_fwd(blk[name], name)
            else:
                ln_fwd()

    layer_of = {**fc, "head": spec.head_layer()}
    # which modules' inputs need a gradient, block by block (LoRA: none before the first adapter)
    lives, live = [], lora is None
    for _ in range(spec.layers):
        needs, out = needs_input_grad(modules, fc, lora, live)
        lives.append((needs, live or out))
        live = out
    head_live = live

    for _ in range(n_microbatches):
        for _ in range(spec.layers):
            block_fwd()
        ln_fwd()
        fc_fwd(head, "head")
        if gy > 1:                                   # vocabulary-parallel cross entropy
            post("y", "all_gather", gy * mprime * STAT_BYTES)
            post("y", "all_reduce", 2 * mprime * STAT_BYTES)
        post("z", "all_reduce", STAT_BYTES)          # the loss, summed over z
        fc_bwd(head, False, "head", head_live)
        ln_bwd(head_live)
        for i in reversed(range(spec.layers)):
            needs, any_grad = lives[i]
            if not any_grad:                         # nothing in the block needs a gradient: no backward at all
                continue
            if recompute:
                block_fwd()
            for name, need in reversed(list(zip(modules, needs))):
                if name in blk:
                    fc_bwd(blk[name], fc[name].bias, name, need)
                elif need or lora is None:
                    ln_bwd(need)
        if lora is None:
            post("z", "all_reduce", spec.seq * hx * STAT_BYTES)      # position table, then token table
            post("z", "all_reduce", spec.vocab * hx * STAT_BYTES)
    return ev


def gpt_dp_gradient_sizes(spec: TransformerShape, grid: tuple[int, int, int, int], grad_dtype_bytes: int,
                          lora: LoraPlan | None = None) -> list[int]:
    """Bytes of each gradient the data-parallel buckets hold, in their layout order (reverse
    ``model.parameters()``); with ``lora`` the adapters' only."""
    if lora is not None:
        return [int(e) * grad_dtype_bytes for e in adapter_tensors(spec, lora, int(grid[0]), int(grid[1]))][::-1]
    return [p.elems * grad_dtype_bytes for p in gpt_parameters(spec, grid)][::-1]


def gpt_collective_events(spec: TransformerShape, grid: tuple[int, int, int, int], tokens_per_microbatch_global: int,
                          n_microbatches: int, dtype_bytes: int, keep_gathered: bool = False, recompute: bool = False,
                          grad_dtype_bytes: int | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                          zero: int = 0, clip: bool = False, lora: LoraPlan | None = None, cp: int = 1,
                          cp_exchange: str = "all_gather") -> list[tuple[str, str, int]]:
    """Every collective of one GPT training step as (group, op, bytes) (with ``lora``: a LoRA step's,
    :mod:`perfmodel.lora`): the micro-batches' forward and backward
    (:func:`gpt_step`), then the data-parallel ones (:func:`perfmodel.comm.dp_events`; listed last even where they
    are posted during the backward), with ``clip`` the clipping's norm all-reduces among them
    (:func:`perfmodel.comm.step_tail`). ``tokens_per_microbatch_global`` must be whole sequences that split over
    Gd·Gz (z splits by sequence; over Gd·Gz/cp under context parallelism, whose key-value exchange over "c"
    follows the micro-batches' events: :func:`perfmodel.context_parallel.step_events`)."""
    gx, gy, gz, gd = (int(v) for v in grid)
    if min(gx, gy, gz, gd) <= 0:
        raise PerfModelError(f"grid sizes must be positive, got {grid}")
    seqs, rem = divmod(tokens_per_microbatch_global, spec.seq)
    if rem or seqs % max(gd * gz // cp, 1):
        raise PerfModelError(f"tokens per micro-batch {tokens_per_microbatch_global} are not whole sequences of "
                             f"{spec.seq} that split over Gd*Gz/cp={gd * gz // cp}")
    mprime = tokens_per_microbatch_global // (gd * gz)
    gb = grad_dtype_bytes or dtype_bytes
    ev = gpt_step(spec, grid, mprime, n_microbatches, dtype_bytes, keep_gathered, recompute, gb, lora)
    ev += cp_step_events(spec, gy, mprime, n_microbatches, dtype_bytes, cp, cp_exchange, recompute)
    dp = dp_events(gpt_dp_gradient_sizes(spec, grid, gb, lora), gd, gb, bucket_bytes, zero, n_microbatches)
    return ev + step_tail(dp, grid, zero, clip)


__all__ = ["STAT_BYTES", "PARAM_BYTES", "GPTParam", "gpt_parameters", "gpt_step", "gpt_dp_gradient_sizes",
           "gpt_collective_events"]
