"""A mixture of experts' MoE layers as perfmodel prices them: expert parallelism (EP) as a split of d, each expert's
FC layers the 3D Linear of a dense MLP. The dense part of a MoE layer (attention, norms, Qwen2-MoE's shared expert)
is the decoder's (``perfmodel.step``, ``TransformerShape.block_layers``); this module adds what the routed
experts cost, on N grids at once (arrays [N]), to the step the rest of perfmodel prices.

The layout (an ``ep`` dividing Gd and the experts ``E``):

=========================  =======================================================================================
expert-parallel group      the ``ep`` ranks with the same x, y, z whose d lies in one block of ``ep`` consecutive d
                           indices; each holds ``E/ep`` experts
expert-replica group       the ``Gd/ep`` ranks with the same x, y, z and the same ``d % ep``: an expert's gradient is
                           all-reduced there (zero 0), reduce-scattered and its parameters all-gathered (zero 1, 2);
                           the dense tensors over all of d as before
an expert                  gate, up ``[f_e, h]`` normal, down ``[h, f_e]`` transposed: 3D Linear layers over x, y,
                           z (:func:`axgrid.spec.fc_volumes`), each with its AG_z, forward AR, backward AR and RS_z
the router                 ``[E, h]`` held as ``[E, h/Gx]`` on every rank (features over x, as a norm's weight;
                           replicated over y, z, d): its logits ``[m', E]`` all-reduced over x in the forward, its
                           gradient ``[E, h/Gx]`` all-reduced over z (fp32, as a norm's) and packed with the dense
                           gradients over d; Qwen2-MoE's shared-expert gate ``[1, h]`` the same way
dispatch, combine          all-to-all inside the EP group: the ``m'·k`` token copies of a rank (``k`` = top-k), each
                           ``[h/Gx]`` in the compute dtype; forward dispatch + combine, backward the same two again,
                           and with recompute the forward's two once more
=========================  =======================================================================================

Load balance: uniform routing (dropless). Every expert receives ``ep·m'·k/E`` token copies from its EP group, so a
rank runs ``m'·k`` copies through its ``E/ep`` experts, ``m_e = m'·k·ep/E`` each, and each all-to-all sends
``(ep−1)/ep`` of its ``m'·k`` copies off the rank: ``(ep−1)/ep · m'·k · ⌈h/Gx⌉ · b`` bytes (the step's bytes count
these). Its time: :func:`all_to_all_time` (NVLink inside a node, the node's NICs shared by its GPUs across
nodes). Real routing is uneven; the busiest rank sets the pace, so this is a lower bound.

Overlap: an expert's AG_z hides under the MoE layer's expert GEMMs with OAG, its RS_z under their backward with ORS;
the all-reduces and the all-to-alls are exposed (the experts wait for the dispatch, the next layer for the
combine); with ODP the expert gradients' reduction over the replica group hides under the MoE layers' backward
GEMMs of the last micro-batch, less what exceeds them. The router's softmax/top-k and the auxiliary loss are
element-wise on ``[m', E]`` and not priced. Layers with a dense MLP (Qwen's ``decoder_sparse_step`` > 1,
``mlp_only_layers``) are refused (:func:`check_moe`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from axgrid.spec import TransformerShape, ceil_div

from axgrid.spec import DEFAULT_BUCKET_BYTES

from .comm import PARAM_BYTES, STAT_BYTES, collective_time, dim_strides, dp_events, layer_volumes, ring_alpha_beta
from .compute import gemm_time
from .errors import PerfModelError

#: per MoE layer and micro-batch: the all-to-alls of the forward (dispatch, combine) and of the backward (the same)
FORWARD_ALL_TO_ALLS = 2
BACKWARD_ALL_TO_ALLS = 2


def check_moe(spec: TransformerShape) -> None:
    """Refuse, in one line, a MoE shape perfmodel does not price: one with dense-MLP layers among its MoE ones."""
    if spec.is_moe and spec.dense_layers:
        raise PerfModelError(f"{spec.name}: layers {list(spec.dense_layers)} have a dense MLP among the MoE layers "
                             f"(decoder_sparse_step / mlp_only_layers); perfmodel prices every layer as MoE")


def ep_sizes(spec: TransformerShape, gd: int) -> list[int]:
    """The EP sizes of a grid with ``gd`` data-parallel ranks: the divisors of Gd that divide the experts ([1] for a
    dense model)."""
    if not spec.is_moe:
        return [1]
    return [e for e in range(1, gd + 1) if gd % e == 0 and spec.experts % e == 0]


def ep_reasons(spec: TransformerShape, gd: int, ep: int) -> list[str]:
    """Why ``ep`` does not fit a grid with ``gd`` data-parallel ranks, each in one line; [] when it fits."""
    out = []
    if ep < 1 or gd % ep:
        out.append(f"ep={ep} does not divide Gd={gd}; the expert-parallel group is a block of ep consecutive d "
                   f"ranks: give ep dividing Gd")
    if not spec.is_moe and ep != 1:
        out.append(f"ep={ep} for {spec.name}, which has no experts; give ep=1")
    elif spec.is_moe and (ep < 1 or spec.experts % ep):
        out.append(f"experts {spec.experts} not divisible by ep={ep}; give ep dividing the experts")
    return out


def expert_tokens(spec: TransformerShape, mprime, ep) -> np.ndarray:
    """Token copies each of a rank's experts runs per micro-batch [N] (uniform routing): ``m'·k·ep/E``."""
    return np.asarray(mprime, float) * spec.top_k * np.asarray(ep, float) / spec.experts


def all_to_all_bytes(spec: TransformerShape, gx, mprime, ep, dtype_bytes: int) -> np.ndarray:
    """Bytes one rank sends off itself in one all-to-all [N] (uniform routing): ``(ep−1)/ep·m'·k·⌈h/Gx⌉·b``."""
    ep = np.asarray(ep, float)
    return (ep - 1) / ep * np.asarray(mprime, float) * spec.top_k * ceil_div(spec.hidden, np.asarray(gx)) * dtype_bytes


def all_to_all_time(sent, ep, stride, machine) -> np.ndarray:
    """Seconds [N] of one all-to-all in which every rank of groups of ``ep`` ranks spaced ``stride`` apart sends
    ``sent`` bytes [N] off itself, evenly to the others (uniform routing). ``q`` of a group's members share a node
    (all of them when the group fits one: ``comm.ring_alpha_beta``'s rule); a rank's ``(q−1)/(ep−1)`` of the bytes
    cross NVLink (or the node's fabric) at the intra-node β, the rest leave through the node's NICs, which every GPU
    of the node uses at once (all groups post together): ``nics · β_nic / gpus_per_node`` each; the two run side
    by side, so the slower sets the time, plus ``(ep−1)·α`` (one message to each peer)."""
    ep = np.asarray(ep, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    per_node = machine.gpus_per_node
    _, _, intra = ring_alpha_beta(ep, stride, machine)
    q = np.where(intra, ep, np.clip(per_node // np.maximum(stride, 1), 1, np.maximum(ep, 1)))
    peers = np.maximum(ep - 1, 1).astype(float)
    inside, outside = np.asarray(sent, float) * (q - 1) / peers, np.asarray(sent, float) * (ep - q) / peers
    local, remote = machine.placement_of("intra"), machine.placement_of("inter")
    t = np.maximum(inside / local.beta, outside / (remote.beta / per_node))
    alpha = np.where(intra, local.alpha, remote.alpha)
    return np.where(ep > 1, (ep - 1) * alpha + t, 0.0)


def all_to_alls(recompute: bool) -> int:
    """All-to-alls per MoE layer per micro-batch: forward's, backward's and, with recompute, the forward's again."""
    return FORWARD_ALL_TO_ALLS * (2 if recompute else 1) + BACKWARD_ALL_TO_ALLS


def expert_elements(spec: TransformerShape, gx, gy, gz, ep) -> np.ndarray:
    """Expert parameter elements one rank stores [N]: ``moe_layers · E/ep`` experts, each its three layers' z
    shards."""
    per_expert = sum(layer_volumes(layer, gx, gy, gz, 1).shard for layer in spec.expert_layers())
    return np.asarray(spec.moe_layers * (spec.experts // np.asarray(ep)) * per_expert, dtype=float)


def expert_static_bytes(spec: TransformerShape, gx, gy, gz, gd, ep, zero: int) -> tuple[np.ndarray, ...]:
    """(parameters, gradients, optimizer) bytes of a rank's experts [N]: fp32 parameters and gradients, AdamW's two
    fp32 moments and a 4-byte step per tensor (3 per expert); with ``zero`` >= 1 the moments sharded over the
    expert-replica group (``Gd/ep`` ranks), with ``zero=2`` the gradients too (buckets' padding not counted)."""
    elems = expert_elements(spec, gx, gy, gz, ep)
    replicas = np.asarray(gd, float) / np.asarray(ep, float)
    steps = 4.0 * spec.moe_layers * (spec.experts // np.asarray(ep)) * len(spec.expert_layers())
    share = elems / replicas if zero else elems
    return 4.0 * elems, 4.0 * (share if zero == 2 else elems), 8.0 * share + steps


def expert_activation_bytes(spec: TransformerShape, gx, gy, mprime, dtype_bytes: int) -> np.ndarray:
    """Bytes one MoE layer's routed path saves for backward on one rank [N] (recompute off): the router's fp32
    logits and probabilities ``8·E`` per token; per token copy (``k`` per token) the dispatched input ``b·⌈h/Gx⌉``,
    the gated MLP's gate and up outputs, activation and product ``4·b·⌈f_e/Gy⌉`` (as the dense MLP's), and the
    expert output before its routing weight ``b·⌈h/Gx⌉`` (the weight's gradient reads it)."""
    b, mp = dtype_bytes, np.asarray(mprime, float)
    hx, fy = ceil_div(spec.hidden, np.asarray(gx)), ceil_div(spec.expert_ffn, np.asarray(gy))
    return mp * (8.0 * spec.experts + spec.top_k * (2.0 * b * hx + 4.0 * b * fy))


def expert_gathered_bytes(spec: TransformerShape, gx, gy, gz, ep, dtype_bytes: int) -> np.ndarray:
    """Bytes of one MoE layer's experts gathered over z on a rank [N] (the ``E/ep`` experts' three blocks, in the
    compute dtype; 0 when Gz = 1)."""
    blocks = sum(layer_volumes(layer, gx, gy, gz, 1).padded for layer in spec.expert_layers())
    return np.where(np.asarray(gz) > 1, (spec.experts // np.asarray(ep)) * blocks * float(dtype_bytes), 0.0)


def moe_flops(spec: TransformerShape, tokens: float, recompute: bool) -> float:
    """FLOPs of the MoE layers' router and routed experts on ``tokens`` tokens in one step: ``(6 + 2r)·T·(k·P_e +
    E·h)`` per MoE layer, ``P_e`` an expert's weights (the active share of
    ``TransformerShape.flops_per_iteration``)."""
    expert = sum(layer.n * layer.k for layer in spec.expert_layers())
    return (6 + 2 * int(recompute)) * tokens * spec.moe_layers * (spec.top_k * expert + spec.router_parameters())


class MoECost(NamedTuple):
    """What the MoE layers add to one step on N grids (arrays [N]): ``fwd``, ``bwd`` compute seconds per
    micro-batch (the experts' and router's GEMMs; ``fwd`` once, the recompute's in ``bwd``); ``exposed``, ``raw``
    communication seconds per group (x, y, z per micro-batch; ``d``: the all-to-alls per micro-batch and
    ``d_step``: the expert-replica reduction per step); ``step_bytes`` per group per step; ``all_to_all_s`` and
    ``all_to_all_bytes`` per step."""

    fwd: np.ndarray
    bwd: np.ndarray
    exposed: dict[str, np.ndarray]
    raw: dict[str, np.ndarray]
    step_bytes: dict[str, np.ndarray]
    all_to_all_s: np.ndarray
    all_to_all_bytes: np.ndarray


def price_moe(spec: TransformerShape, g, ep, mprime, mp_int, mb, dtype_bytes: int, grad_bytes: int, opt,
              machine, dtype: str) -> MoECost:
    """The MoE layers' cost (:class:`MoECost`) on grids ``g`` (``space.Grids``) with EP sizes ``ep`` [N],
    ``mprime`` tokens per rank per micro-batch (float; ``mp_int`` whole), ``mb`` micro-batches, in the options'
    ``opt`` overlap, recompute and ``zero`` (module docstring)."""
    n = len(g)
    ep = np.asarray(ep, dtype=np.int64)
    zeros = {k: np.zeros(n) for k in ("x", "y", "z", "d", "d_step")}
    if not spec.is_moe:
        return MoECost(np.zeros(n), np.zeros(n), dict(zeros), {k: v.copy() for k, v in zeros.items()},
                       {k: v.copy() for k, v in zeros.items()}, np.zeros(n), np.zeros(n))
    check_moe(spec)
    L, b, gb, r = spec.moe_layers, dtype_bytes, grad_bytes, bool(opt.recompute)
    local = spec.experts // ep                                        # experts per rank
    me = expert_tokens(spec, mprime, ep)
    me_int = np.maximum(np.floor(expert_tokens(spec, mp_int, ep)), 1).astype(np.int64)
    size = {"x": g.gx, "y": g.gy, "z": g.gz, "d": g.gd}
    geo = dim_strides(g.gx, g.gy, g.gz, g.gd, opt.order)
    on = {k: (v > 1).astype(float) for k, v in size.items()}

    def ring(op: str, dim: str, nbytes, p=None, stride=None) -> np.ndarray:
        p = geo[dim][0] if p is None else p
        a, be, _ = ring_alpha_beta(p, geo[dim][1] if stride is None else stride, machine)
        return collective_time(op, p, nbytes, a, be, machine)

    fwd, bwd, dw = np.zeros(n), np.zeros(n), np.zeros(n)
    ag, rs, ar_fwd, ar_bwd = np.zeros(n), np.zeros(n), {d: np.zeros(n) for d in "xy"}, {d: np.zeros(n) for d in "xy"}
    nbytes = {k: np.zeros(n) for k in ("x", "y", "z", "d")}
    n_fwd = 1 + int(r)
    n_ag = n_fwd + int(not opt.keep_gathered)
    for layer in spec.expert_layers():
        v = layer_volumes(layer, g.gx, g.gy, g.gz, me_int)
        fwd += local * gemm_time(me, v.n_loc, v.k_loc, machine, dtype)
        bwd += local * gemm_time(me, v.k_loc, v.n_loc, machine, dtype)
        dw += local * gemm_time(v.n_loc, v.k_loc, me, machine, dtype)
        ag += local * ring("all_gather", "z", v.padded * b)
        rs += local * ring("reduce_scatter", "z", v.padded * gb)
        ar_fwd[v.fwd_ar_dim] += local * ring("all_reduce", v.fwd_ar_dim, v.fwd_ar * b)
        ar_bwd[v.bwd_ar_dim] += local * ring("all_reduce", v.bwd_ar_dim, v.bwd_ar * b)
        nbytes[v.fwd_ar_dim] += local * n_fwd * v.fwd_ar * b * on[v.fwd_ar_dim]
        nbytes[v.bwd_ar_dim] += local * v.bwd_ar * b * on[v.bwd_ar_dim]
        nbytes["z"] += local * (n_ag * v.padded * b + v.padded * gb) * on["z"]
    hx = ceil_div(spec.hidden, g.gx)
    router = spec.router_parameters() // spec.hidden                 # E (+ 1: Qwen2-MoE's shared-expert gate)
    fwd += gemm_time(np.asarray(mprime, float), router, hx, machine, dtype)
    bwd += 2 * gemm_time(np.asarray(mprime, float), hx, router, machine, dtype)
    router_ar = ring("all_reduce", "x", mp_int * router * b)
    router_dw = ring("all_reduce", "z", hx * router * STAT_BYTES)
    nbytes["x"] += (n_fwd * mp_int * router * b + mp_int * spec.top_k * b) * on["x"]   # + the weights' gradient
    nbytes["z"] += (hx * router * STAT_BYTES + n_fwd * g.gz * mp_int * spec.experts * b) * on["z"]   # + the logits' AG_z

    # the all-to-alls over the EP group: ep ranks spaced as d's
    sent = all_to_all_bytes(spec, g.gx, mp_int, ep, b)
    one = all_to_all_time(sent, ep, geo["d"][1], machine)
    calls = all_to_alls(r)
    a2a = L * calls * one

    compute_fwd = L * fwd
    compute_bwd = L * (bwd + dw + (fwd if r else 0.0))
    exposed, raw = {k: np.zeros(n) for k in zeros}, {k: np.zeros(n) for k in zeros}
    gathers = L * n_ag * ag
    exposed["z"] += np.maximum(gathers - compute_fwd - (L * fwd if r else 0.0), 0.0) if opt.overlap_ag else gathers
    scatters = L * (rs + router_dw)
    exposed["z"] += np.maximum(scatters - L * dw, 0.0) if opt.overlap_rs else scatters
    raw["z"] += gathers + scatters
    for d in "xy":
        t = L * (n_fwd * ar_fwd[d] + ar_bwd[d]) + (L * n_fwd * router_ar if d == "x" else 0.0)
        exposed[d] += t
        raw[d] += t
    exposed["d"] += a2a
    raw["d"] += a2a

    # the experts' gradients over the expert-replica group (Gd/ep ranks, spaced ep·d's stride), once per step
    replicas = g.gd // ep
    grads = expert_elements(spec, g.gx, g.gy, g.gz, ep)
    stride = geo["d"][1] * ep
    if opt.zero == 0:
        dp = ring("all_reduce", "d", grads * gb, replicas, stride)
        dp_bytes = grads * gb
    else:
        n_rs = np.asarray(mb, float) if opt.zero == 2 else 1.0
        dp = n_rs * ring("reduce_scatter", "d", grads * gb, replicas, stride) + ring(
            "all_gather", "d", grads * PARAM_BYTES, replicas, stride)
        dp_bytes = n_rs * grads * gb + grads * PARAM_BYTES
    dp = np.where(replicas > 1, dp, 0.0)
    dp_exposed = np.maximum(dp - compute_bwd, 0.0) if opt.overlap_dp else dp
    mbf = np.asarray(mb, float)
    # the ledger's all-to-all bytes (group "e", counted under d here): whole send buffers, the dispatch's in the fp32
    # stream and the combine's in the compute dtype, forward (again with recompute) and backward; the counts' E int64
    rows = mp_int * spec.top_k * hx
    buffers = n_fwd * (rows * PARAM_BYTES + rows * b + spec.experts * 8) + rows * (b + PARAM_BYTES)
    clip = 8.0 * bool(getattr(opt, "clip", False)) * (not opt.zero)      # the experts' norms summed over "e"
    # the experts' buckets over "r" (counted under d), as the replay posts them: padding and used-flags included
    bucketed = np.array([sum(e[2] for e in expert_dp_events(spec, t, int(p), gb, int(opt.zero or 0), int(m),
                                                             opt.bucket_bytes))
                         for t, p, m in zip(g.tuples(), ep.tolist(), np.broadcast_to(np.asarray(mb), (n,)))], dtype=float)
    nbytes["d"] += (mbf * L * np.where(ep > 1, buffers, 0.0) + np.where(ep > 1, clip, 0.0) + bucketed)
    for k in ("x", "y", "z"):                        # one MoE layer's above: every layer, every micro-batch
        nbytes[k] = mbf * L * nbytes[k]
    exposed["d_step"], raw["d_step"] = dp_exposed, dp
    return MoECost(compute_fwd, compute_bwd, exposed, raw, nbytes, mbf * a2a, mbf * L * calls * sent)



def moe_layer_events(spec: TransformerShape, grid: tuple[int, int, int, int], ep: int, mprime: int,
                     dtype_bytes: int, grad_dtype_bytes: int, keep_gathered: bool,
                     forward: bool) -> list[tuple[str, str, int]]:
    """One MoE layer's collectives on one micro-batch for the step replay (``perfmodel.step``), as (dim, op,
    bytes), in posting order, as the runtime's ledger counts them (``axgrid.expert_parallel``; the dry run compares
    them call by call): ``forward``: the router's AR_x, the router's logits all-gathered over z (``[Gz·m', E]``, for
    the auxiliary loss), the per-expert counts' all-to-all (``E`` int64), the dispatch
    all-to-all, each local expert's layers (AG_z, forward AR), the combine all-to-all; else the combine's backward
    all-to-all, the experts' layers in reverse (AG_z again unless ``keep_gathered``, the input gradient's AR, RS_z),
    the dispatch's backward all-to-all, the routing weights' gradient summed over x (``[m', k]``), the router's AR_z.
    The all-to-alls are posted on the expert-parallel group ``"e"`` (``ep`` ranks of d), and their bytes are the
    ledger's: a rank's whole send buffer (uniform routing: ``m'·k`` rows of ``⌈h/Gx⌉``), the dispatch's in the
    residual stream's fp32 (the decoder's norm output under autocast), the combine's in the compute dtype, each
    backward in its forward's (:func:`all_to_all_bytes` is what leaves the rank, for the time); dimensions of size 1
    post nothing."""
    gx, gy, gz, _ = (int(v) for v in grid)
    size = {"x": gx, "y": gy, "z": gz, "e": ep}
    b, gb = dtype_bytes, grad_dtype_bytes
    me = max(int(expert_tokens(spec, mprime, ep)), 1)
    rows = mprime * spec.top_k * ceil_div(spec.hidden, gx)          # a rank's send buffer, in elements
    stream, computed = rows * PARAM_BYTES, rows * b                 # the dispatch's (fp32 stream), the combine's
    router = spec.router_parameters() // spec.hidden
    hx = ceil_div(spec.hidden, gx)
    local = spec.experts // ep
    layers = [(layer, layer_volumes(layer, gx, gy, gz, me)) for layer in spec.expert_layers()]
    ev: list[tuple[str, str, int]] = []
    if forward:
        ev.append(("x", "all_reduce", mprime * router * b))
        ev.append(("z", "all_gather", gz * mprime * spec.experts * b))    # the block's logits (the auxiliary loss)
        ev.append(("e", "all_to_all", spec.experts * 8))
        ev.append(("e", "all_to_all", stream))
        for _ in range(local):
            for _, v in layers:
                ev += [("z", "all_gather", int(v.padded) * b), (v.fwd_ar_dim, "all_reduce", int(v.fwd_ar) * b)]
        ev.append(("e", "all_to_all", computed))
    else:
        ev.append(("e", "all_to_all", computed))
        for _ in range(local):
            for _, v in reversed(layers):
                ev += [] if keep_gathered else [("z", "all_gather", int(v.padded) * b)]
                ev += [(v.bwd_ar_dim, "all_reduce", int(v.bwd_ar) * b), ("z", "reduce_scatter", int(v.padded) * gb)]
        ev.append(("e", "all_to_all", stream))
        ev.append(("x", "all_reduce", mprime * spec.top_k * b))
        ev.append(("z", "all_reduce", hx * router * STAT_BYTES))
    return [e for e in ev if size[e[0]] > 1 and e[2] > 0]


def expert_dp_events(spec: TransformerShape, grid: tuple[int, int, int, int], ep: int, grad_dtype_bytes: int,
                     zero: int, microbatches: int,
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[tuple[str, str, int]]:
    """The experts' gradients over their replica group ``"r"`` (``Gd/ep`` ranks) in one step, as the runtime's
    experts' own buckets post them (``axgrid.data_parallel.gradients``: ``perfmodel.comm.dp_events`` over the expert
    tensors in reverse model order, on ``"r"``): zero 0 an all-reduce per bucket and the used-flags'; zero 1 a
    reduce-scatter per bucket (zero 2 in every micro-batch), the flags, then the fp32 parameters' all-gathers; none
    with ``Gd/ep`` = 1."""
    gx, gy, gz, gd = (int(v) for v in grid)
    if not spec.is_moe or gd // ep == 1:
        return []
    per_expert = [int(layer_volumes(layer, gx, gy, gz, 1).shard) * grad_dtype_bytes for layer in spec.expert_layers()]
    sizes = (per_expert * (spec.moe_layers * (spec.experts // ep)))[::-1]
    return [("r", op, nb) for _, op, nb in dp_events(sizes, gd // ep, grad_dtype_bytes, bucket_bytes, zero,
                                                     microbatches)]


def with_expert_memory(mem, spec: TransformerShape, gx, gy, gz, gd, ep, mprime, dtype_bytes: int, opt):
    """``mem`` (``perfmodel.memory.Memory`` of the dense part) with the routed experts added [N]: their parameters,
    gradients and optimizer state (:func:`expert_static_bytes`) in ``static``; one MoE layer's gathered experts
    (:func:`expert_gathered_bytes`) in ``buffers``; their saved activations (:func:`expert_activation_bytes`) in
    ``activations`` for every MoE layer without recompute, with recompute in ``buffers`` for the one layer being
    recomputed; the experts' gathered blocks only where two of the largest exceed the dense part's. ``mem`` itself for a dense model."""
    if not spec.is_moe:
        return mem
    from dataclasses import replace
    params, grads, optimizer = expert_static_bytes(spec, gx, gy, gz, gd, ep, int(opt.zero or 0))
    # the experts' blocks pass through the same weight source one at a time (the current and the prefetched next),
    # after the attention's: they add what two of the largest exceed the dense part's gathered peak (the dry run
    # measures no more; all local experts' blocks at once is what expert_gathered_bytes gives, a bound)
    largest = np.maximum.reduce([np.asarray(layer_volumes(layer, gx, gy, gz, 1).padded, dtype=float)
                                 for layer in spec.expert_layers()])
    pair = np.where(np.asarray(gz) > 1, 2.0 * largest * dtype_bytes, 0.0)
    gathered = pair if mem.gathered is None else np.maximum(pair - mem.gathered, 0.0)
    act = expert_activation_bytes(spec, gx, gy, mprime, dtype_bytes)
    static = mem.static + params + grads + optimizer
    buffers = mem.buffers + gathered + (act if opt.recompute else 0.0)
    activations = mem.activations + (0.0 if opt.recompute else spec.moe_layers * act)
    def plus(part, extra):                      # a part the layout does not itemise stays None
        return None if part is None else part + extra
    return replace(mem, static=static, buffers=buffers, activations=activations,
                   total=static + buffers + activations, params=plus(mem.params, params),
                   grads=plus(mem.grads, grads), optimizer=plus(mem.optimizer, optimizer),
                   gathered=plus(mem.gathered, gathered))


def expert_kernels(spec: TransformerShape, ep) -> np.ndarray:
    """Kernels one MoE layer's forward launches [N] beyond the dense part's: per local expert its three GEMMs, the
    activation and the product (experts run one after another); the router's GEMM, softmax and top-k; the
    dispatch's and combine's permutations (4)."""
    return (spec.experts // np.asarray(ep)) * 5 + 3 + 4 if spec.is_moe else np.zeros_like(np.asarray(ep))


def expert_elementwise_bytes(spec: TransformerShape, gx, gy, mprime, dtype_bytes: int) -> np.ndarray:
    """HBM bytes one MoE layer's forward moves outside the GEMMs on a rank [N], per token copy (``k`` per token):
    the gated activation and product on ``⌈f_e/Gy⌉`` features (read gate and up, write the activation, read it,
    write the product: ``5·b``), the dispatch's and combine's permutations and the weighted sum on ``⌈h/Gx⌉``
    (``4·b``); the router's softmax on ``[m', E]`` fp32 (8 per score)."""
    if not spec.is_moe:
        return np.zeros(np.shape(mprime))
    b, mp = dtype_bytes, np.asarray(mprime, float)
    hx, fy = ceil_div(spec.hidden, np.asarray(gx)), ceil_div(spec.expert_ffn, np.asarray(gy))
    return mp * (spec.top_k * (5.0 * b * fy + 4.0 * b * hx) + 8.0 * spec.experts)


__all__ = ["BACKWARD_ALL_TO_ALLS", "FORWARD_ALL_TO_ALLS", "MoECost", "all_to_all_bytes", "all_to_all_time", "all_to_alls",
           "check_moe", "ep_reasons", "ep_sizes", "expert_activation_bytes", "expert_elements",
           "expert_elementwise_bytes", "expert_gathered_bytes", "expert_kernels", "expert_static_bytes",
           "expert_tokens", "moe_flops", "price_moe", "with_expert_memory", "moe_layer_events",
           "expert_dp_events"]
