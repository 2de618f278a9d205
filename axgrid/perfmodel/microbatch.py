"""One micro-batch's forward and backward on N grids (numpy arrays [N], seconds): a loop over the spec's FC layers.

The layers are ``TransformerShape.block_layers`` (run once per block, ``layers`` times) then ``head_layer``, each
priced by :class:`LayerCost`; no layer is named here, so a layer added to ``axgrid.spec.block_layers`` is priced,
counted and overlapped like the others, the attention core goes with the layer whose ``FCLayer.attention`` is set
(QKV) and a layer norm with the layer whose ``FCLayer.norm`` names it.

Forward of layer j: GEMM (+ the attention core); AG_z(j) is hidden under layer j−1's forward when OAG is on (the
first layer's is exposed); the output all-reduce is blocking. Backward (reverse order): AG_z again unless
keep_gathered (blocking); with recompute the whole block's forward (its AG_z, prefetched in order with OAG, and its
output all-reduces) is redone before the backward of the block's last layer (MLP-down); the input-gradient
all-reduce hides under the dW GEMM when OAR is on; RS_z(j) hides under the rest of the backward compute of the next
layer processed when ORS is on (the last one is exposed); the bias AR_z is blocking. Each window of compute hides at
most one collective, so the model is monotone: more bandwidth or more FLOP/s never predicts a slower step.
The step's other collectives (``perfmodel.step``: layer-norm statistics AR_x and gradient AR_z, the embedding
tables' gradient AR_z, the vocabulary-parallel cross entropy's AG_y and AR_y, the loss AR_z; all fp32) are priced
per call, as blocking; with ORS the layer norms' AR_z (one call each for weight and bias, as the runtime posts it)
join the reduce-scatter of the layer they feed, right before them in the backward, and hide under the same window,
while the embeddings' AR_z, posted last in the backward, stay exposed.

Every sum keeps one order of its terms (the model's since it was validated), so results reproduce to the bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from axgrid.spec import FCLayer, FCVolumes, TransformerShape

from .comm import GROUPS, collective_time, dim_strides, layer_volumes, ring_alpha_beta
from .compute import gemm_rate, gemm_time
from .step import STAT_BYTES, loss_elements, norm_volumes, table_events
from .machines import Machine
from .space import Grids
from .problem import Options


def _pos(a):
    return np.maximum(a, 0.0)


# ---------------------------------------------------------------- what each layer and collective costs


@dataclass(frozen=True)
class Rings:
    """The rings of every grid dimension on N grids: ``geo`` dim → (group size, stride) [N] (``comm.dim_strides``),
    ``ab`` dim → (α [s], β [bytes/s], intra-node mask) [N] (``comm.ring_alpha_beta``)."""

    geo: dict[str, tuple[np.ndarray, np.ndarray]]
    ab: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    machine: Machine

    @staticmethod
    def of(g: Grids, order: str, machine: Machine) -> Rings:
        """The rings of grids ``g`` with rank ``order`` (fastest dimension first) on ``machine``."""
        geo = dim_strides(g.gx, g.gy, g.gz, g.gd, order)
        return Rings(geo, {dim: ring_alpha_beta(p, s, machine) for dim, (p, s) in geo.items()}, machine)

    def time(self, op: str, dim: str, nbytes) -> np.ndarray:
        """Seconds [N] of one ring ``op`` ("all_reduce", "all_gather", "reduce_scatter") over ``dim`` on a buffer of
        ``nbytes`` (scalar or [N]): α-β, or the machine's measured table where it holds one
        (``comm.collective_time``)."""
        a, be, _ = self.ab[dim]
        return collective_time(op, self.geo[dim][0], nbytes, a, be, self.machine)


class LayerCost(NamedTuple):
    """One FC layer of the step, priced per micro-batch on N grids (seconds, arrays [N]).

    ``reps``: the times a step runs it (``layers`` for a block layer, 1 for the head); ``vol``: its per-rank sizes
    (``axgrid.spec.fc_volumes``); ``fwd``: its forward window, the GEMM ``[m', k_loc]·[k_loc, n_loc]`` (+ the
    attention core when ``layer.attention``); ``bwd``: the input-gradient GEMM ``[m', n_loc]·[n_loc, k_loc]`` (+
    the attention core's backward, twice its forward); ``dw``: the weight-gradient GEMM ``[n_loc, m']·[m', k_loc]``;
    ``ag``/``rs``: AG_z / RS_z of the padded weight block; ``ar_fwd``/``ar_bwd``: the forward output's all-reduce
    over ``vol.fwd_ar_dim`` and the input gradient's over ``vol.bwd_ar_dim``; ``bias_z``: AR_z of the bias
    gradient."""

    layer: FCLayer
    reps: int
    vol: FCVolumes
    fwd: np.ndarray
    bwd: np.ndarray
    dw: np.ndarray
    ag: np.ndarray
    rs: np.ndarray
    ar_fwd: np.ndarray
    ar_bwd: np.ndarray
    bias_z: np.ndarray


def attention_time(spec: TransformerShape, g: Grids, mprime: np.ndarray, machine: Machine, dtype: str) -> np.ndarray:
    """Seconds [N] of one block's forward attention core per micro-batch (QKᵀ and ·V on the H/Gy local heads of
    whole sequences, replicated over x): 4·m'·K·a/Gy FLOPs at the rate of an ``[S, S]·[S, d]`` GEMM, with ``a``
    the attention width (``H·d``; ``h`` for the GPT), ``d`` the head size and ``K`` the key span averaged over the
    layers (``TransformerShape.attended_keys``: ``S``, less with sliding windows). Key-value heads change the
    bytes, not the FLOPs: each query head multiplies with its group's keys."""
    S = spec.seq
    batch = np.maximum(np.asarray(mprime, float) / S, 1.0) * spec.heads / g.gy        # sequences × local heads
    flops = 4.0 * mprime * spec.attended_keys() * spec.attention_width / g.gy
    return flops / gemm_rate(S, S, spec.head_dim, machine, dtype, batch)


def layer_costs(spec: TransformerShape, g: Grids, mprime: np.ndarray, mp_int: np.ndarray, dtype_bytes: int,
                machine: Machine, dtype: str, rings: Rings, att: np.ndarray,
                grad_bytes: int | None = None) -> list[LayerCost]:
    """Every FC layer of the step in forward order (the spec's block layers, then the head), priced per
    micro-batch: ``mprime`` tokens per GPU [N] (float) size the GEMMs, ``mp_int`` (whole tokens, at least 1) the
    messages; weights gathered and activations reduced in elements of ``dtype_bytes``, gradients reduced in
    elements of ``grad_bytes`` (default: ``dtype_bytes``); ``att``: the attention core's forward [N]
    (:func:`attention_time`), joined to the windows of the layer that carries it."""
    b = dtype_bytes
    gb = grad_bytes or dtype_bytes
    out = []
    for layer, reps in [(layer, spec.layers) for layer in spec.block_layers()] + [(spec.head_layer(), 1)]:
        v = layer_volumes(layer, g.gx, g.gy, g.gz, mp_int)
        fwd = gemm_time(mprime, v.n_loc, v.k_loc, machine, dtype)
        bwd = gemm_time(mprime, v.k_loc, v.n_loc, machine, dtype)
        if layer.attention:
            fwd, bwd = fwd + att, bwd + 2 * att
        out.append(LayerCost(layer, reps, v, fwd, bwd, dw=gemm_time(v.n_loc, v.k_loc, mprime, machine, dtype),
                             ag=rings.time("all_gather", "z", v.padded * b),
                             rs=rings.time("reduce_scatter", "z", v.padded * gb),
                             ar_fwd=rings.time("all_reduce", v.fwd_ar_dim, v.fwd_ar * b),
                             ar_bwd=rings.time("all_reduce", v.bwd_ar_dim, v.bwd_ar * b),
                             bias_z=rings.time("all_reduce", "z", v.bias_loc * gb)))
    return out


class SideCosts(NamedTuple):
    """The collectives beyond the FC layers' (``perfmodel.step``; fp32, blocking), seconds
    per call [N]: ``ln_fwd``: a norm's forward statistics (a LayerNorm's 2 AR_x of ``[m']``, mean and variance; an
    RMSNorm's one); ``ln_bwd_x``: its backward AR_x (``[m', 2]``; ``[m']``); ``ln_bwd_z``: its parameters'
    gradient AR_z (weight and bias ``[2·h/Gx]`` in one call; the weight ``[h/Gx]``); ``emb_z``: the embedding
    tables' gradients over z (the GPT's AR_z of ``[S, h/Gx]`` and ``[V, h/Gx]``; a decoder's token table's AR_z,
    or tied to the head, the RS_z of the head's block) and a tied table's forward lookup (AG_z of the head's block
    and AR_y of ``[m', h/Gx]``); ``ce_y``: the vocabulary-parallel cross entropy's AG_y and AR_y; ``loss_z``: the
    loss's AR_z (the GPT's sum; a decoder's ``[sum, count]``)."""

    ln_fwd: np.ndarray
    ln_bwd_x: np.ndarray
    ln_bwd_z: np.ndarray
    emb_z: np.ndarray
    ce_y: np.ndarray
    loss_z: np.ndarray


def table_bytes(spec: TransformerShape, mp_int, hx, head_padded, dtype_bytes: int,
                grad_bytes: int) -> list[tuple[str, str, object]]:
    """(op, dim, bytes) of every collective of the embedding tables in one micro-batch, as the replay posts them
    (``perfmodel.step.table_events``: forward, then backward)."""
    fwd, bwd = table_events(spec, mp_int, hx, head_padded, dtype_bytes, grad_bytes)
    return [(op, dim, nbytes) for dim, op, nbytes in fwd + bwd]


def side_costs(spec: TransformerShape, g: Grids, mp_int: np.ndarray, hx: np.ndarray, rings: Rings,
               head_padded=0, dtype_bytes: int = STAT_BYTES, grad_bytes: int = STAT_BYTES) -> SideCosts:
    """:class:`SideCosts` with ``mp_int`` tokens per GPU per micro-batch and ``hx`` = h/Gx features [N];
    ``head_padded``: the head's padded weight block [N] (a tied table's collectives move it)."""
    ar = "all_reduce"
    calls, fwd, bwd_x, bwd_z = norm_volumes(spec, mp_int, hx)
    tables = np.zeros(len(g))
    for op, dim, nbytes in table_bytes(spec, mp_int, hx, head_padded, dtype_bytes, grad_bytes):
        tables = tables + rings.time(op, dim, nbytes)
    return SideCosts(
        ln_fwd=calls * rings.time(ar, "x", fwd * STAT_BYTES),
        ln_bwd_x=rings.time(ar, "x", bwd_x * STAT_BYTES),
        ln_bwd_z=rings.time(ar, "z", bwd_z * STAT_BYTES),
        emb_z=tables,
        ce_y=(rings.time("all_gather", "y", g.gy * mp_int * STAT_BYTES)
              + rings.time(ar, "y", 2 * mp_int * STAT_BYTES)),
        loss_z=rings.time(ar, "z", np.full(len(g), STAT_BYTES * loss_elements(spec))))


# ---------------------------------------------------------------- overlap chains


def prefetch_chain(coll: list[np.ndarray], win: list[np.ndarray], blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, slack) [N] of a chain that runs each layer's collective under the window of the layer before it
    (OAG: the next layer's AG_z prefetched while the current one computes), over ``blocks`` repetitions of a
    block whose layers have collectives ``coll`` and compute windows ``win``, both in processing order.

    Block b's first collective hides under block b−1's last window; the very first one has no window before it and
    is exposed, and the very last window hides nothing (all of it is slack). Summed collective by collective."""
    first, last = coll[0], win[-1]
    exposed = (blocks - 1) * _pos(first - last) + first
    slack = last + (blocks - 1) * _pos(last - first)
    for c, w in zip(coll[1:], win[:-1]):
        exposed = exposed + blocks * _pos(c - w)
        slack = slack + blocks * _pos(w - c)
    return exposed, slack


def drain_chain(coll: list[np.ndarray], win: list[np.ndarray], blocks: int, head_coll: np.ndarray,
                head_win: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, slack) [N] of a chain that runs each layer's collective under the window of the next layer
    processed (ORS: a reduce-scatter under the rest of the backward), in backward order: the head first, then
    ``blocks`` repetitions of a block whose layers have collectives ``coll`` and windows ``win`` (both in forward
    order, processed last to first).

    The head's collective hides under the last block's last window; block b's first collective under block
    b−1's last window; block 0's first has nothing after it and is exposed, and the head's window comes first and
    hides nothing. Exposed is summed collective by collective, slack window by window, in processing order."""
    first, last = coll[0], win[-1]
    exposed = _pos(head_coll - last)
    slack = head_win + _pos(last - head_coll) + (blocks - 1) * _pos(last - first)
    for c, w in zip(reversed(coll[1:]), reversed(win[:-1])):
        exposed = exposed + blocks * _pos(c - w)
        slack = slack + blocks * _pos(w - c)
    exposed = exposed + (blocks - 1) * _pos(first - last) + first
    return exposed, slack


# ---------------------------------------------------------------- forward and backward


@dataclass
class CommTally:
    """Communication seconds per group (arrays [N]; the grid dimensions and the block "xyz": ``comm.GROUPS``):
    ``exposed`` after overlap and ``raw`` in all, accumulated term by term in the order the model prices them."""

    exposed: dict[str, np.ndarray]
    raw: dict[str, np.ndarray]

    @staticmethod
    def zeros(n: int) -> CommTally:
        return CommTally({d: np.zeros(n) for d in GROUPS}, {d: np.zeros(n) for d in GROUPS})

    def add(self, dim: str, exposed: np.ndarray | None, raw: np.ndarray | None) -> None:
        """Add seconds to ``dim``'s exposed and raw totals (None: nothing)."""
        if exposed is not None:
            self.exposed[dim] += exposed
        if raw is not None:
            self.raw[dim] += raw


def forward(costs: list[LayerCost], blocks: int, opt: Options, comm: CommTally) -> np.ndarray:
    """The forward's compute [N] (seconds per micro-batch); adds its FC collectives to ``comm``: AG_z, prefetched
    along the layers with OAG (the head's under the last block's last layer), and the output all-reduces, twice
    for recomputed layers (the recompute forward in backward repeats them)."""
    block, head = costs[:-1], costs[-1]
    gathers = sum(c.reps * c.ag for c in costs)
    if opt.overlap_ag:
        exposed, _ = prefetch_chain([c.ag for c in block], [c.fwd for c in block], blocks)
        exposed = exposed + _pos(head.ag - block[-1].fwd)
    else:
        exposed = gathers
    comm.add("z", exposed, gathers)
    for c in costs:
        t = c.reps * c.ar_fwd * (2 if (opt.recompute and c.layer.recompute) else 1)
        comm.add(c.vol.fwd_ar_dim, t, t)
    return sum(c.reps * c.fwd for c in costs)


def add_side(spec: TransformerShape, side: SideCosts, opt: Options, comm: CommTally) -> None:
    """Add the GPT's other collectives of a micro-batch (blocking; ``perfmodel.step``) to ``comm``: every layer
    norm's AR_x (forward, again for the blocks' in the recompute forward, and backward), the cross entropy's y
    collectives, the embeddings' and the loss's AR_z, and the layer norms' gradient AR_z unless ORS takes them."""
    n_ln = spec.layer_norms()
    n_ln_fwd = n_ln + (spec.layers * spec.block_norms() if opt.recompute else 0)
    side_dims = {"x": n_ln_fwd * side.ln_fwd + n_ln * side.ln_bwd_x, "y": side.ce_y,
                 "z": side.emb_z + side.loss_z + (0.0 if opt.overlap_rs else n_ln * side.ln_bwd_z)}
    for d, t in side_dims.items():
        comm.add(d, t, t)


def _backward_windows(costs: list[LayerCost], recompute: bool) -> list[np.ndarray]:
    """Each layer's backward compute window [N] besides its dW GEMM: the input-gradient GEMM; with recompute the
    block's last layer (processed first) also runs the whole block's forward again."""
    windows = [c.bwd for c in costs]
    if recompute:
        last = len(costs) - 2                     # the block's last layer; costs[-1] is the head
        windows[last] = windows[last] + sum(c.fwd for c in costs[:-1])
    return windows


def _recompute_gathers(block: list[LayerCost], blocks: int, overlap_ag: bool, comm: CommTally) -> np.ndarray | None:
    """Add the AG_z of the recompute forward (each block's weights gathered again) to ``comm``; with OAG they are
    prefetched in order, each recompute GEMM window hiding the next layer's gather (the last block's first gather
    is exposed), and the recompute windows' slack [N] is returned (they then hide no reduce-scatter: one
    collective per window); None without OAG."""
    gathers = sum(c.reps * c.ag for c in block)
    if not overlap_ag:
        comm.add("z", gathers, gathers)
        return None
    exposed, slack = prefetch_chain([c.ag for c in block], [c.fwd for c in block], blocks)
    comm.add("z", exposed, gathers)
    return slack


def _backward_all_reduces(c: LayerCost, overlap_ar: bool, comm: CommTally) -> np.ndarray:
    """Add layer ``c``'s backward all-reduces to ``comm``: the input gradient's (under the dW GEMM with OAR) and
    the bias gradient's AR_z (blocking), with its RS_z's raw time; returns the dW window's slack [N]."""
    if overlap_ar:
        comm.add(c.vol.bwd_ar_dim, c.reps * _pos(c.ar_bwd - c.dw), c.reps * c.ar_bwd)
        slack = c.reps * _pos(c.dw - c.ar_bwd)
    else:
        comm.add(c.vol.bwd_ar_dim, c.reps * c.ar_bwd, c.reps * c.ar_bwd)
        slack = c.reps * c.dw
    comm.add("z", c.reps * c.bias_z, c.reps * (c.bias_z + c.rs))
    return slack


def _reduce_scatters(spec: TransformerShape, costs: list[LayerCost], side: SideCosts, windows: list[np.ndarray],
                     overlap_rs: bool, comm: CommTally) -> np.ndarray:
    """Add the exposed RS_z of every layer to ``comm`` and return the slack [N] of the backward ``windows``: with
    ORS along the chain of the backward (:func:`drain_chain`), where a layer norm's gradient AR_z goes through the
    same pipeline right after the reduce-scatter of the layer it feeds (the GPT's head -> ln_f, up -> ln2,
    qkv -> ln1) and hides under the same window; without ORS each is blocking."""
    if not overlap_rs:
        comm.add("z", sum(c.reps * c.rs for c in costs), None)
        return sum(c.reps * w for c, w in zip(costs, windows))
    # a norm's gradient joins the reduce-scatter of the layer it feeds (``norm``) or follows (Gemma's ``post_norm``)
    rs = [c.rs + (bool(c.layer.norm) + bool(c.layer.post_norm)) * side.ln_bwd_z if (c.layer.norm or c.layer.post_norm)
          else c.rs for c in costs]
    exposed, slack = drain_chain(rs[:-1], windows[:-1], spec.layers, rs[-1], windows[-1])
    comm.add("z", exposed, spec.layer_norms() * side.ln_bwd_z)
    return slack


def backward(spec: TransformerShape, costs: list[LayerCost], side: SideCosts, opt: Options,
             comm: CommTally) -> tuple[np.ndarray, np.ndarray]:
    """(compute, slack) [N] of a micro-batch's backward (seconds): its GEMMs, and the compute that hides no
    collective (which ODP's data-parallel buckets can use); adds its collectives to ``comm``: AG_z again (unless
    keep_gathered) and in the recompute forward, each layer's input-gradient and bias all-reduces, the RS_z."""
    windows = _backward_windows(costs, opt.recompute)
    compute = sum(c.reps * (w + c.dw) for c, w in zip(costs, windows))
    slack = np.zeros(len(compute))
    if not opt.keep_gathered:
        t = sum(c.reps * c.ag for c in costs)
        comm.add("z", t, t)
    rest = list(windows)    # the backward windows that hide ORS's reduce-scatters
    if opt.recompute:
        free = _recompute_gathers(costs[:-1], spec.layers, opt.overlap_ag, comm)
        if free is not None:            # the recompute windows hide gathers, not reduce-scatters
            slack += free
            rest[len(costs) - 2] = costs[-2].bwd
    for c in costs:
        slack += _backward_all_reduces(c, opt.overlap_ar, comm)
    slack += _reduce_scatters(spec, costs, side, rest, opt.overlap_rs, comm)
    return compute, slack
