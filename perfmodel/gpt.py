"""The whole GPT training step as the runtime (``axgrid.models.gpt.GPT``) posts it: every collective, in order,
and the order in which gradients become final (which decides the data-parallel buckets under ODP).

Beyond the FC layers' own collectives (:mod:`perfmodel.comm`), per micro-batch, with ``m'`` tokens per GPU and
``h_x = h/Gx`` (all of these are fp32 in the runtime whatever the training dtype: ``STAT_BYTES``):

==========================  =====================================================================================
LayerNorm forward           2 AR_x of ``[m']`` (mean, then variance), for each of the 2L+1 layer norms (and the
                            2L of the blocks again in the recompute forward)
LayerNorm backward          AR_x of ``[m', 2]``; AR_z of the weight and bias gradients: one call of ``[2·h_x]``,
                            or with ORS one call each of ``[h_x]`` (through the gradient pipeline)
embeddings backward         AR_z of the dense table gradients: the position table ``[S, h_x]`` first, then the
                            token table ``[V, h_x]`` (all rows, features over x)
cross entropy (forward)     AG_y of ``[m']`` (ledger: the output ``[Gy·m']``), AR_y of ``[m', 2]``; only when Gy > 1
loss (forward)              AR_z of one number; only when Gz > 1
==========================  =====================================================================================

Per step, the data-parallel mean over d reduces every trainable parameter (``model.parameters()`` order: token
table, position table, per block its modules' (``TransformerSpec.block_modules``: ln1 w/b, QKV w/b, out w/b,
ln2 w/b, up w/b, down w/b); ln_f w/b; head weight) in
buckets, in the gradient dtype. With ODP the buckets are filled in the order gradients become final during the
last micro-batch's backward: immediately (autograd's post-accumulate hook) for gradients returned to autograd,
and for gradients posted to the ORS pipeline (every FC weight and bias with ORS on; layer norms and embeddings
with ORS on and Gz > 1) when the pipeline completes them, which it does ``axgrid.spec.GRADIENT_WINDOW`` (two)
posts later or at the end of the backward. This assumes every parameter is watched (``grid.watch(model)``, as
``experiments/train/train_gpt.py`` does).
"""
from __future__ import annotations

from typing import NamedTuple

from axgrid.spec import DEFAULT_BUCKET_BYTES, GRADIENT_WINDOW, ceil_div

from .comm import dp_buckets, layer_volumes
from .errors import PerfModelError
from .spec import TransformerSpec

#: Bytes per element of the runtime's fp32 side collectives (layer-norm statistics and parameter gradients,
#: cross-entropy reductions, the loss, the embedding gradients over z).
STAT_BYTES = 4


class GPTParam(NamedTuple):
    """One trainable tensor of the GPT on one rank: ``key`` (e.g. "b3.up.w"), elements on this rank, and
    ``kind``: "fc_w", "fc_b", "ln" or "emb"."""

    key: str
    elems: int
    kind: str


def gpt_parameters(spec: TransformerSpec, grid: tuple[int, int, int, int]) -> list[GPTParam]:
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


def gpt_step(spec: TransformerSpec, grid: tuple[int, int, int, int], mprime: int, n_microbatches: int,
             dtype_bytes: int, keep_gathered: bool = False, recompute: bool = False,
             grad_dtype_bytes: int | None = None, overlap_rs: bool = False
             ) -> tuple[list[tuple[str, str, int]], list[str]]:
    """(events, ready): every collective of the step but the data-parallel ones, as (dim, op, bytes) in posting
    order, and the parameter keys in the order their gradients become final in the last micro-batch's backward
    (see the module docstring). ``mprime``: tokens per GPU per micro-batch."""
    gx, gy, gz, gd = (int(v) for v in grid)
    size = {"x": gx, "y": gy, "z": gz, "d": gd}
    b, gb = dtype_bytes, grad_dtype_bytes or dtype_bytes
    hx = ceil_div(spec.hidden, gx)
    fc = {L.name: L for L in spec.block_layers()}
    blk = {name: layer_volumes(L, gx, gy, gz, mprime) for name, L in fc.items()}
    head = layer_volumes(spec.head_layer(), gx, gy, gz, mprime)
    modules = spec.block_modules()
    ev: list[tuple[str, str, int]] = []
    ready: list[str] = []
    inflight: list[tuple[str, ...]] = []

    def post(dim: str, op: str, nbytes: int) -> None:
        if size[dim] > 1 and nbytes > 0:
            ev.append((dim, op, int(nbytes)))

    def pipe(*keys: str) -> None:        # ORS: GradientPipeline._post (one entry per call)
        inflight.append(keys)
        while len(inflight) > GRADIENT_WINDOW:
            ready.extend(inflight.pop(0))

    def fc_fwd(v) -> None:
        post("z", "all_gather", v.padded * b)
        post(v.fwd_ar_dim, "all_reduce", v.fwd_ar * b)

    def fc_bwd(key: str, v, bias: bool) -> None:
        if not keep_gathered:
            post("z", "all_gather", v.padded * b)
        post(v.bwd_ar_dim, "all_reduce", v.bwd_ar * b)
        post("z", "reduce_scatter", v.padded * gb)
        if overlap_rs:
            pipe(key + ".w")
        else:
            ready.append(key + ".w")
        if bias:
            post("z", "all_reduce", v.bias_loc * gb)
            if overlap_rs:
                pipe(key + ".b")
            else:
                ready.append(key + ".b")

    def ln_fwd() -> None:
        post("x", "all_reduce", mprime * STAT_BYTES)
        post("x", "all_reduce", mprime * STAT_BYTES)

    def ln_bwd(key: str) -> None:
        post("x", "all_reduce", 2 * mprime * STAT_BYTES)
        if gz > 1 and overlap_rs:                 # weight and bias summed in one call, one pipeline entry
            post("z", "all_reduce", 2 * hx * STAT_BYTES)
            pipe(key + ".w", key + ".b")
        else:
            post("z", "all_reduce", 2 * hx * STAT_BYTES)
            ready.extend((key + ".w", key + ".b"))

    def emb_bwd(key: str, rows: int) -> None:
        post("z", "all_reduce", rows * hx * STAT_BYTES)
        if overlap_rs and gz > 1:
            pipe(key)
        else:
            ready.append(key)

    def block_fwd() -> None:
        for name in modules:
            if name in blk:
                fc_fwd(blk[name])
            else:
                ln_fwd()

    for _ in range(n_microbatches):
        ready.clear()
        inflight.clear()
        for _ in range(spec.layers):
            block_fwd()
        ln_fwd()
        fc_fwd(head)
        if gy > 1:                                   # vocabulary-parallel cross entropy
            post("y", "all_gather", gy * mprime * STAT_BYTES)
            post("y", "all_reduce", 2 * mprime * STAT_BYTES)
        post("z", "all_reduce", STAT_BYTES)          # the loss, summed over z
        fc_bwd("head", head, False)
        ln_bwd("ln_f")
        for i in reversed(range(spec.layers)):
            if recompute:
                block_fwd()
            for name in reversed(modules):
                if name in blk:
                    fc_bwd(f"b{i}.{name}", blk[name], fc[name].bias)
                else:
                    ln_bwd(f"b{i}.{name}")
        emb_bwd("wpe", spec.seq)
        emb_bwd("wte", spec.vocab)
        for keys in inflight:                        # GradientPipeline.finish at the end of the backward
            ready.extend(keys)
    return ev, ready


def gpt_dp_gradient_sizes(spec: TransformerSpec, grid: tuple[int, int, int, int], grad_dtype_bytes: int,
                          overlap_dp: bool = False, overlap_rs: bool = False) -> list[int]:
    """Bytes of each gradient the data-parallel all-reduce carries, in the order the runtime buckets them:
    ``model.parameters()`` order (``sync_gradients``), or with ODP the order they become final."""
    params = gpt_parameters(spec, grid)
    if not overlap_dp:
        return [p.elems * grad_dtype_bytes for p in params]
    by_key = {p.key: p.elems for p in params}
    _, ready = gpt_step(spec, grid, 1, 1, 4, overlap_rs=overlap_rs)
    return [by_key[k] * grad_dtype_bytes for k in ready if k in by_key]


def gpt_collective_events(spec: TransformerSpec, grid: tuple[int, int, int, int], tokens_per_microbatch_global: int,
                          n_microbatches: int, dtype_bytes: int, keep_gathered: bool = False, recompute: bool = False,
                          grad_dtype_bytes: int | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                          overlap_dp: bool = False, overlap_rs: bool = False) -> list[tuple[str, str, int]]:
    """Every collective of one GPT training step as (dim, op, bytes): the micro-batches' forward and backward
    (:func:`gpt_step`), then the data-parallel gradient buckets (listed last even with ODP, where they are
    posted during the last backward). ``tokens_per_microbatch_global`` must be whole sequences that split
    over Gd·Gz (z splits by sequence)."""
    gx, gy, gz, gd = (int(v) for v in grid)
    if min(gx, gy, gz, gd) <= 0:
        raise PerfModelError(f"grid sizes must be positive, got {grid}")
    seqs, rem = divmod(tokens_per_microbatch_global, spec.seq)
    if rem or seqs % (gd * gz):
        raise PerfModelError(f"tokens per micro-batch {tokens_per_microbatch_global} are not whole sequences of "
                             f"{spec.seq} that split over Gd*Gz={gd * gz}")
    mprime = tokens_per_microbatch_global // (gd * gz)
    gb = grad_dtype_bytes or dtype_bytes
    ev, _ = gpt_step(spec, grid, mprime, n_microbatches, dtype_bytes, keep_gathered, recompute, gb, overlap_rs)
    if gd > 1:
        sizes = gpt_dp_gradient_sizes(spec, grid, gb, overlap_dp, overlap_rs)
        ev += [("d", "all_reduce", nb) for nb in dp_buckets(sizes, bucket_bytes, overlap_dp)]
    return ev


__all__ = ["STAT_BYTES", "GPTParam", "gpt_parameters", "gpt_step", "gpt_dp_gradient_sizes", "gpt_collective_events"]
