"""Collectives: what each FC layer posts (in elements, as the runtime's ledger counts them), where each ring
sits (placement → α, β), and α-β ring costs. Everything is vectorised over N grid configurations.

Ledger convention: one entry per posted call, size = the full buffer: the all-reduced tensor, the all-gather
OUTPUT, the reduce-scatter INPUT. A collective over a group of size 1 is not posted.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

import numpy as np

from axgrid.spec import DEFAULT_BUCKET_BYTES, FCLayer, FCVolumes, TransformerShape, fc_volumes
from axgrid.spec.buckets import pack_buckets

from .errors import PerfModelError
from .machines import Machine

DIMS = ("x", "y", "z", "d")
#: The groups a step posts collectives over, as the ledger names them: the four grid dimensions and the
#: tensor-parallel block "xyz" (the gradient clipping's norm, :func:`clip_events`).
GROUPS = DIMS + ("xyz",)

#: Bytes per parameter element the runtime keeps (fp32; autocast casts per GEMM): what the all-gather of the
#: parameters over d moves with ``zero`` >= 1.
PARAM_BYTES = 4
#: Bytes per element of the runtime's fp32 side collectives (norm statistics and parameter gradients, cross-entropy
#: reductions, the loss, the embedding gradients over z).
STAT_BYTES = 4
OPS = ("all_reduce", "all_gather", "reduce_scatter")
#: Bytes of the gradient clipping's all-reduce: one fp64 element, the sum of squares of the gradients this rank
#: counts (``axgrid.data_parallel.gradients.clip_grad_norm_``).
CLIP_NORM_BYTES = 8


def as_layer(t: FCLayer | tuple) -> FCLayer:
    return t if isinstance(t, FCLayer) else FCLayer(*t)


def layer_volumes(layer: FCLayer | tuple, gx, gy, gz, mprime) -> FCVolumes:
    """``axgrid.spec.fc_volumes`` (elements per call of layer W [n, k], n and k that do not divide padded up)
    on int64 arrays: scalars or one entry per grid [N]."""
    gx, gy, gz, mprime = (np.asarray(a, dtype=np.int64) for a in (gx, gy, gz, mprime))
    return fc_volumes(as_layer(layer), gx, gy, gz, mprime)


#: Bytes per parameter of the data-parallel "used" flags (an int32 count of the d-ranks with a gradient).
USED_FLAG_BYTES = 4


def dp_buckets(sizes_bytes: Iterable[int], bucket_bytes: int = DEFAULT_BUCKET_BYTES, parts: int = 1,
               element_bytes: int = 1) -> list[int]:
    """Bytes of each data-parallel bucket the runtime builds for gradients of ``sizes_bytes`` (one dtype of
    ``element_bytes``) given in the buckets' packing order (:func:`dp_gradient_sizes`): ``axgrid.spec.buckets``'
    rule -- a tensor joins the open bucket, which is closed once it holds ``bucket_bytes`` or more -- each bucket
    padded to a multiple of ``parts`` elements (``zero`` >= 1: Gd). Tensors of 0 bytes add nothing."""
    if bucket_bytes <= 0:
        raise PerfModelError(f"bucket_bytes must be positive, got {bucket_bytes}")
    sizes = [int(s) for s in sizes_bytes if int(s) > 0]
    buckets = pack_buckets([s // element_bytes for s in sizes], [element_bytes] * len(sizes), [0] * len(sizes),
                           bucket_bytes, parts)
    return [b.padded * element_bytes for b in buckets]


def dp_gradient_sizes(layers: Iterable[FCLayer | tuple], grid: tuple[int, int, int, int],
                      grad_dtype_bytes: int) -> list[int]:
    """Bytes of each gradient of a stack of FC layers in the data-parallel buckets' packing order: reverse
    ``model.parameters()`` (last layer first, its bias before its weight shard), whatever the overlap switches."""
    gx, gy, gz, _ = (int(v) for v in grid)
    sizes: list[int] = []
    for L in (as_layer(t) for t in layers):
        v = layer_volumes(L, gx, gy, gz, 1)
        sizes += [int(v.shard) * grad_dtype_bytes, int(v.bias_loc) * grad_dtype_bytes]
    return sizes[::-1]


def used_flag_bytes(sizes_bytes: Iterable[int]) -> int:
    """Bytes of the data-parallel "used" flags for gradients of ``sizes_bytes``: one int32 per parameter that
    holds a gradient piece here (:data:`USED_FLAG_BYTES` each; the buffer ``GradBuckets._post_used_flags``
    all-reduces over d)."""
    return USED_FLAG_BYTES * sum(1 for s in sizes_bytes if s > 0)


def dp_events(sizes_bytes: Iterable[int], gd: int, grad_dtype_bytes: int, bucket_bytes: int, zero: int,
              n_microbatches: int) -> list[tuple[str, str, int]]:
    """The data-parallel collectives of one step as (dim, op, bytes), for gradients of ``sizes_bytes`` (packing
    order) on ``gd`` data-parallel ranks: ``zero=0`` an all-reduce per bucket; ``zero`` >= 1 a reduce-scatter per
    bucket padded to a multiple of Gd (in each of the ``n_microbatches`` backwards with ``zero=2``), then an
    all-gather of the parameters (fp32, :data:`PARAM_BYTES`) per bucket. Each mode also all-reduces one int32 flag
    per parameter (which parameters some d-rank has a gradient for: the optimizer skips the others,
    :meth:`axgrid.data_parallel.buckets.GradBuckets.used_params`): ``zero=0`` after the buckets, ``zero`` >= 1 at the
    optimizer's step, before the all-gathers. None when Gd = 1."""
    if gd == 1:
        return []
    gb = grad_dtype_bytes
    sizes = [int(s) for s in sizes_bytes]
    used = ("d", "all_reduce", used_flag_bytes(sizes))
    buckets = dp_buckets(sizes, bucket_bytes, gd if zero else 1, gb)
    if zero == 0:
        return [("d", "all_reduce", nb) for nb in buckets] + [used]
    rs = [("d", "reduce_scatter", nb) for nb in buckets] * (n_microbatches if zero == 2 else 1)
    return rs + [used] + [("d", "all_gather", nb // gb * PARAM_BYTES) for nb in buckets]


def fc_forward_events(v: FCVolumes, dtype_bytes: int) -> list[tuple[str, str, int]]:
    """One FC layer's forward on one micro-batch, as (dim, op, bytes): the weight block gathered over z, the output
    all-reduced (over y, or x for the transposed layers). Dimensions of size 1 and empty calls are the caller's to
    drop (the runtime posts nothing there)."""
    return [("z", "all_gather", int(v.padded) * dtype_bytes), (v.fwd_ar_dim, "all_reduce", int(v.fwd_ar) * dtype_bytes)]


def fc_backward_events(v: FCVolumes, dtype_bytes: int, grad_dtype_bytes: int,
                       bias: bool = True) -> list[tuple[str, str, int]]:
    """One FC layer's backward after its weight block is at hand (gathered again unless kept: the caller's), as
    (dim, op, bytes): the input gradient all-reduced, the weight gradient reduce-scattered over z, the bias gradient
    (``bias``) all-reduced over z."""
    ev = [(v.bwd_ar_dim, "all_reduce", int(v.bwd_ar) * dtype_bytes),
          ("z", "reduce_scatter", int(v.padded) * grad_dtype_bytes)]
    return ev + ([("z", "all_reduce", int(v.bias_loc) * grad_dtype_bytes)] if bias else [])


def clip_events(grid: tuple[int, int, int, int], zero: int) -> list[tuple[str, str, int]]:
    """The collectives of the global gradient-norm clipping (``axgrid.clip_grad_norm_``, ``train_step(clip>0)``;
    the 2-norm) as (group, op, bytes): the fp64 sum of squares all-reduced over the tensor-parallel block "xyz"
    (when Gx·Gy·Gz > 1), then with ``zero`` >= 1 over "d" too (each d-rank counts its own share of the gradients;
    when Gd > 1). Posted after the gradients' data-parallel reduction, before the optimizer step."""
    gx, gy, gz, gd = (int(v) for v in grid)
    out = [("xyz", "all_reduce", CLIP_NORM_BYTES)] if gx * gy * gz > 1 else []
    return out + ([("d", "all_reduce", CLIP_NORM_BYTES)] if zero and gd > 1 else [])


def step_tail(dp: list[tuple[str, str, int]], grid: tuple[int, int, int, int], zero: int,
              clip: bool) -> list[tuple[str, str, int]]:
    """The end of a step after the backward: the data-parallel collectives ``dp`` (:func:`dp_events`) and, with
    ``clip``, the clipping's (:func:`clip_events`) after the gradients' reduction, before the parameters'
    all-gather (``zero`` >= 1)."""
    late = ("all_reduce", "all_gather") if zero else ("all_gather",)    # zero >= 1: posted by the optimizer's step
    grads = [e for e in dp if e[1] not in late]
    return grads + (clip_events(grid, zero) if clip else []) + [e for e in dp if e[1] in late]


def collective_events(
    layers: Iterable[FCLayer | tuple],
    grid: tuple[int, int, int, int],
    tokens_per_microbatch_global: int,
    n_microbatches: int,
    dtype_bytes: int,
    keep_gathered: bool = False,
    recompute: bool = False,
    grad_dtype_bytes: int | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    zero: int = 0,
    clip: bool = False,
    lora=None,
    cp: int = 1,
    cp_exchange: str = "all_gather",
) -> list[tuple[str, str, int]]:
    """Every collective one training step posts, in order, as (dim, op, bytes).

    ``layers`` an ``axgrid.spec.TransformerShape``: the whole step as the runtime posts it -- FC layers, norms,
    embeddings, vocabulary-parallel cross entropy, loss, and the data-parallel buckets of every parameter -- for the
    GPT (``axgrid.models.gpt.GPT``) or a Hugging Face decoder (its plan): :func:`perfmodel.step.step_collective_events`,
    the one replay.

    ``layers`` a list of FC layers (a stack of FC layers only): per micro-batch the forward
    (AG_z, forward AR) over layers in order, then the backward in reverse order (with recompute, for layers with
    .recompute, the forward's AG_z and AR again; AG_z unless keep_gathered; backward AR; RS_z of dW; AR_z of the
    bias gradient); then the data-parallel collectives of the gradients (weight shards and biases) in buckets of
    ``bucket_bytes``, formed as the runtime forms them, in ``zero``'s mode (:func:`dp_events`). Listed after the
    backward even where they are posted during it (ODP, ``zero=2``).
    ``grad_dtype_bytes`` (default: dtype_bytes) sizes the gradient collectives RS_z, bias AR_z and AR_d.
    ``clip``: the step clips the global gradient norm (the drivers' default, ``--clip 1.0``): its all-reduces
    (:func:`clip_events`, over the group "xyz" and with ``zero`` >= 1 over d) follow the gradients' reduction.
    ``lora``: a ``perfmodel.lora.LoraPlan`` (a LoRA step of a TransformerShape), or None. ``cp``, ``cp_exchange``:
    context parallelism of a TransformerShape's step (:mod:`perfmodel.context_parallel`)."""
    if isinstance(layers, TransformerShape):
        from .step import step_collective_events
        return step_collective_events(layers, grid, tokens_per_microbatch_global, n_microbatches, dtype_bytes,
                                      keep_gathered, recompute, grad_dtype_bytes, bucket_bytes, zero, clip, lora,
                                      cp=cp, cp_exchange=cp_exchange)
    if lora is not None:
        raise PerfModelError("lora: a LoRA step is priced for a TransformerShape, not a list of FC layers")
    layers = [as_layer(t) for t in layers]
    gx, gy, gz, gd = (int(v) for v in grid)
    if min(gx, gy, gz, gd) <= 0:
        raise PerfModelError(f"grid sizes must be positive, got {grid}")
    if tokens_per_microbatch_global % (gd * gz):
        raise PerfModelError(f"tokens per micro-batch {tokens_per_microbatch_global} not divisible by Gd*Gz={gd * gz}")
    mprime = tokens_per_microbatch_global // (gd * gz)
    size = {"x": gx, "y": gy, "z": gz, "d": gd}
    b, gb = dtype_bytes, grad_dtype_bytes or dtype_bytes
    vols = [layer_volumes(L, gx, gy, gz, mprime) for L in layers]
    ev: list[tuple[str, str, int]] = []

    def post(events: list[tuple[str, str, int]]) -> None:
        ev.extend(e for e in events if size[e[0]] > 1 and e[2] > 0)

    for _ in range(n_microbatches):
        for v in vols:
            post(fc_forward_events(v, b))
        for L, v in reversed(list(zip(layers, vols))):
            if not keep_gathered:
                post(fc_forward_events(v, b)[:1])
            if recompute and L.recompute:            # the recompute forward gathers the weight again
                post(fc_forward_events(v, b))
            post(fc_backward_events(v, b, gb))
    dp = dp_events(dp_gradient_sizes(layers, grid, gb), gd, gb, bucket_bytes, zero, n_microbatches)
    return ev + step_tail(dp, grid, zero, clip)


def collective_bytes(layers, grid, tokens_per_microbatch_global, n_microbatches, dtype_bytes,
                     keep_gathered: bool = False, recompute: bool = False,
                     grad_dtype_bytes: int | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                     zero: int = 0, clip: bool = False, lora=None, cp: int = 1,
                     cp_exchange: str = "all_gather") -> dict[tuple[str, str], int]:
    """Total bytes per (group, op) for one step, e.g. {("z", "all_gather"): 1536, ("x", "all_reduce"): ...}.
    Same arguments as ``collective_events``; (dim, op) pairs with nothing posted are absent."""
    out: Counter = Counter()
    for dim, op, nb in collective_events(layers, grid, tokens_per_microbatch_global, n_microbatches,
                                         dtype_bytes, keep_gathered, recompute, grad_dtype_bytes, bucket_bytes,
                                         zero, clip, lora, cp, cp_exchange):
        out[(dim, op)] += nb
    return dict(out)


def collective_calls(layers, grid, tokens_per_microbatch_global, n_microbatches, dtype_bytes,
                     keep_gathered: bool = False, recompute: bool = False,
                     grad_dtype_bytes: int | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                     zero: int = 0, clip: bool = False, lora=None, cp: int = 1,
                     cp_exchange: str = "all_gather") -> dict[tuple[str, str], int]:
    """Number of posted calls per (group, op) for one step (same arguments as ``collective_bytes``); over d that
    is the number of gradient buckets (per collective)."""
    return dict(Counter((d, o) for d, o, _ in collective_events(
        layers, grid, tokens_per_microbatch_global, n_microbatches, dtype_bytes, keep_gathered, recompute,
        grad_dtype_bytes, bucket_bytes, zero, clip, lora, cp, cp_exchange)))


# ---------------------------------------------------------------- placement and ring costs


def dim_strides(gx, gy, gz, gd, order: str = "xyzd") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """dim → (group size p, stride in rank order), for the rank order given fastest-first."""
    size = {"x": np.asarray(gx), "y": np.asarray(gy), "z": np.asarray(gz), "d": np.asarray(gd)}
    out, stride = {}, np.ones_like(size["x"])
    for dim in order:
        out[dim] = (size[dim], stride)
        stride = stride * size[dim]
    return out


def ring_alpha_beta(p, stride, machine: Machine) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """α [s], β [bytes/s] and an intra-node mask for rings of p members spaced ``stride`` ranks apart, when all
    groups of that dimension run at once (they do: every rank posts the same collective).

    A group fits a node when p·stride ≤ gpus_per_node and divides it: intra-node, else inter-node. β, in order
    of precedence: a fitted (calibrated) α-β of that class; the machine's measured ``bandwidth_table`` row of
    that class with the largest stride ≤ the ring's stride, then the largest group ≤ p; else the link-sharing
    rule: intra-node β_intra; across nodes each node holds q = clip(gpus_per_node // stride, 1, p) members of a
    ring, so gpus_per_node / q rings leave every node at once and share its NICs:
    β = min(β_intra, β_inter_node · q / gpus_per_node). α is always the class's latency."""
    p = np.asarray(p, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    g = machine.gpus_per_node
    span = p * stride
    intra = (span <= g) & (g % np.maximum(span, 1) == 0)
    ia, ib = machine.placement_of("intra").alpha, machine.placement_of("intra").beta
    ea, eb = machine.placement_of("inter").alpha, machine.placement_of("inter").beta
    q = np.clip(g // np.maximum(stride, 1), 1, np.maximum(p, 1)).astype(float)
    beta_inter = np.minimum(ib, eb * q / g)
    alpha = np.where(intra, ia, ea)
    beta = np.where(intra, ib, beta_inter)
    for cls, mask in (("intra", intra), ("inter", ~intra)):
        if cls in machine.placement:          # calibrated: the fitted α-β form stays
            continue
        for row in sorted((r for r in machine.bandwidth_table if r.placement == cls),
                          key=lambda r: (r.stride, r.group)):
            beta = np.where(mask & (stride >= row.stride) & (p >= row.group), row.beta, beta)
    return alpha, beta, intra


def _table_bandwidth(tables, p: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Bus bandwidth [N] of one collective's ``tables`` (``machines.CollectiveTable``, any order) at group sizes
    ``p`` and buffers ``nbytes``: log-log in size within each measured group (beyond the sizes measured, the
    nearest size's bandwidth: below the smallest the α-β latency then bounds the time, ``collective_time``), then log-log in group size between
    the two measured groups around p (above the largest, the largest's); NaN below the smallest group."""
    tables = sorted(tables, key=lambda t: t.group)
    groups = np.array([t.group for t in tables], float)
    ls = np.log(np.maximum(nbytes, 1.0))

    def at(t) -> np.ndarray:
        x, y = np.log(np.array(t.nbytes)), np.log(np.array(t.bus_bandwidth))
        return np.exp(np.interp(ls, x, y))        # beyond the sizes measured: the nearest size's bandwidth
    per = np.stack([at(t) for t in tables])                                # [tables, N]
    lp = np.log(np.clip(p, groups[0], groups[-1]))
    hi = np.clip(np.searchsorted(np.log(groups), lp), 1, len(groups) - 1) if len(groups) > 1 else np.zeros_like(p)
    if len(groups) == 1:
        bw = per[0]
    else:
        lo = hi - 1
        g0, g1 = np.log(groups[lo]), np.log(groups[hi])
        w = (lp - g0) / (g1 - g0)
        cols = np.arange(per.shape[1])
        bw = np.exp((1 - w) * np.log(per[lo, cols]) + w * np.log(per[hi, cols]))
    return np.where(p < groups[0], np.nan, bw)


def measured_time(op: str, p, nbytes, machine: Machine) -> np.ndarray:
    """Seconds [N] of one ``op`` over ``p`` GPUs on a buffer of ``nbytes`` (ledger convention) from the machine's
    measured ``collective_tables`` (nccl-tests' bus bandwidth: (p−1)/p · bytes / busbw, twice that for an
    all-reduce), NaN where none covers it (no table for the op, or p below every measured group); an all-reduce
    without its own table is a reduce-scatter then an all-gather of the same buffer, when both are held."""
    p = np.asarray(p, float)
    nbytes = np.broadcast_to(np.asarray(nbytes, float), np.broadcast_shapes(p.shape, np.shape(nbytes)))
    p = np.broadcast_to(p, nbytes.shape)
    held = {t.collective for t in machine.collective_tables}
    if op not in held:
        if op == "all_reduce" and {"all_gather", "reduce_scatter"} <= held:
            return measured_time("reduce_scatter", p, nbytes, machine) + measured_time("all_gather", p, nbytes,
                                                                                         machine)
        return np.full(nbytes.shape, np.nan)
    bw = _table_bandwidth([t for t in machine.collective_tables if t.collective == op], p.ravel(), nbytes.ravel())
    f = 2.0 if op == "all_reduce" else 1.0
    t = f * (p.ravel() - 1) / np.maximum(p.ravel(), 1) * nbytes.ravel() / bw
    return np.where((p.ravel() > 1) & (nbytes.ravel() > 0), t, 0.0).reshape(nbytes.shape)


def collective_time(op: str, p, nbytes, alpha, beta, machine: Machine, calls=1) -> np.ndarray:
    """Seconds [N] of ``calls`` collectives moving ``nbytes`` in all (``nbytes / calls`` each): the α-β ring
    (:func:`ring_time`, latency once per call) and, where the machine holds a measured table for it
    (:func:`measured_time`), the larger of the two: the table measures consecutive GPUs with the network to
    themselves, the α-β rule the sharing of a node's links by rings spaced apart, and each bounds the time from
    below."""
    calls = np.asarray(calls, float)
    ab = ring_time(op, p, nbytes, alpha, beta) + (calls - 1) * (2.0 if op == "all_reduce" else 1.0) * (
        np.asarray(p, float) - 1) * alpha * (np.asarray(nbytes) > 0)
    if not machine.collective_tables:
        return ab
    tab = calls * measured_time(op, p, np.asarray(nbytes, float) / np.maximum(calls, 1), machine)
    return np.where(np.isnan(tab), ab, np.maximum(ab, tab))


def ring_time(op: str, p, nbytes, alpha, beta) -> np.ndarray:
    """Ring cost in seconds on a buffer of ``nbytes`` (all-reduce tensor / AG output / RS input):
    all-reduce 2(p−1)/p·S/β + 2(p−1)α; all-gather and reduce-scatter (p−1)/p·S/β + (p−1)α.
    p = 1 costs 0."""
    p = np.asarray(p, dtype=float)
    f = 2.0 if op == "all_reduce" else 1.0
    if op not in OPS:
        raise PerfModelError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    t = f * (p - 1) / np.maximum(p, 1) * np.asarray(nbytes, dtype=float) / beta + f * (p - 1) * alpha
    return np.where(np.asarray(nbytes) > 0, t, 0.0)
