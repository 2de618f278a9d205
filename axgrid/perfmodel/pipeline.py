"""Megatron-style TP×PP×DP, priced with the same compute, communication and memory code as the 4D grids.

A configuration is TP t (1D tensor parallel inside a node: the 4D grid (1, t, 1, ·) -- column-parallel QKV and
MLP-up, row-parallel attention-out and MLP-down, one all-reduce per pair in forward and in backward), PP p
pipeline stages of L/p blocks each, DP d = GPUs/(t·p) replicas, a micro-batch of ``mbs`` sequences
(m = batch/(d·mbs) micro-batches per step), VPP v interleaved model chunks per stage, and sequence parallel on or
off, and activation recompute ``full`` (the whole block's forward again in the backward: its GEMMs, attention and
TP all-reduces), ``selective`` (Korthikanti et al. 2022, §4: only the core attention -- QKᵀ, softmax, ·V -- again,
one forward attention per block per micro-batch; its activations are those of no recompute, since this model's
memory already stores no S×S tensor, flash-style) or ``none``; always with Megatron's distributed optimizer
(optimizer states sharded over d).

One stage is priced by ``model.evaluate`` on the grid (1, t, 1, d) for a model of ceil(L/p) blocks that also
carries the embeddings and the LM head (the last stage, the slowest one; the first stage's memory is over-counted
by the head). Stages may be uneven (L not divisible by p: the fullest stage sets the pace); interleaving needs
L divisible by p·v. Rank order: TP fastest, then DP, then PP (Megatron's default), so the stage neighbour is t·d ranks
away. Per micro-batch a stage takes t_mb = (GEMMs + exposed TP/z communication) / m, plus the activation sends
to the next stage and the gradient sends back, 2·v per micro-batch of [mbs·S, h/t] (Megatron scatters the send
over the TP ranks), each bytes/β + α on the ring placement of a pair t·d ranks apart, exposed.

    step time = (m + (p−1)/v) · (t_mb + p2p_mb) + exposed data-parallel gradient reduction + clipping's norm

so the bubble is (p−1)/v of m + (p−1)/v slots: (p−1)/(m+p−1) of the step without interleaving. Memory: the
first stage keeps the stored activations of min(m, p) micro-batches alive in 1F1B; interleaved, Megatron's
warm-up of 2(p−1) + (v−1)·p + 1 chunks of L/(p·v) blocks. Sequence parallel splits the layer-norm/residual
activations over t; its time is that of plain TP here: each all-reduce becomes a reduce-scatter + all-gather of
the same ring volume, and the layer-norm/dropout/residual work it splits over t is priced as element-wise
(``compute.elementwise_bytes`` on [mbs·S/t, h]; without SP [mbs·S, h], replicated over TP; the scores of an unfused
attention [mbs, H/t, S, S] when the options say so, repeated with full or selective recompute).
Not modelled: the embedding/head imbalance between stages beyond "the last stage is the slowest", p2p overlap,
zero-bubble schedules, tensor parallel across nodes, context parallel.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .comm import GROUPS, ring_alpha_beta
from .errors import PerfModelError
from .machines import Machine
from .model import evaluate
from .row import Row
from .space import Grids, divisors
from .problem import Problem, model_flops

MICROBATCH_SIZES = (1, 2, 4, 8)
VPP_CHOICES = (1, 2, 4)


@dataclass(frozen=True)
class TPPPDP:
    """One Megatron-style configuration: TP × PP × DP GPUs, ``mbs`` sequences per micro-batch, ``vpp`` model
    chunks per stage, sequence parallel ``sp``."""

    tp: int
    pp: int
    dp: int
    mbs: int = 1
    vpp: int = 1
    sp: bool = False
    recompute: str | None = None    # "full", "selective", "none"; None: full when Options.recompute, else none

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def recompute_mode(self, prob: Problem) -> str:
        """The activation recompute this configuration runs with ("full", "selective" or "none")."""
        if self.recompute is not None:
            return self.recompute
        return "full" if prob.options.recompute else "none"


RECOMPUTE_MODES = ("full", "selective", "none")


def check_config(prob: Problem, c: TPPPDP) -> str:
    """Why ``c`` cannot run ``prob`` ("" when it can, memory aside)."""
    spec = prob.model
    if min(c.tp, c.pp, c.dp, c.mbs, c.vpp) <= 0:
        return f"TP, PP, DP, micro-batch size and VPP must be positive, got {c}"
    if c.gpus != prob.gpus:
        return f"TP·PP·DP = {c.tp}·{c.pp}·{c.dp} = {c.gpus} is not the {prob.gpus} GPUs"
    if c.pp > spec.layers:
        return f"PP {c.pp} is more than the {spec.layers} layers"
    if c.vpp > 1 and spec.layers % (c.pp * c.vpp):
        return f"interleaving needs layers {spec.layers} divisible by PP·VPP = {c.pp * c.vpp}"
    if prob.batch % (c.dp * c.mbs):
        return f"batch {prob.batch} not divisible by DP·micro-batch size = {c.dp * c.mbs}"
    m = prob.batch // (c.dp * c.mbs)
    if c.vpp > 1 and (c.pp == 1 or m % c.pp):
        return f"interleaving (VPP {c.vpp}) needs PP > 1 and micro-batches {m} divisible by PP {c.pp}"
    if c.sp and c.tp == 1:
        return "sequence parallel needs TP > 1"
    if c.recompute is not None and c.recompute not in RECOMPUTE_MODES:
        return f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {c.recompute!r}"
    return ""


def _inflight(p: int, v: int, m: int) -> float:
    """Micro-batches (in units of a whole stage's L/p blocks) whose activations the first stage holds at once."""
    if v == 1:
        return float(min(m, p))
    chunks = min(2 * (p - 1) + (v - 1) * p + 1, m * v)
    return chunks / v


def stage_layers(spec_layers: int, pp: int) -> int:
    """Blocks on the fullest stage: ceil(L/p) (Megatron needs L % p == 0 unless stages are uneven)."""
    return -(-spec_layers // pp)


def price(prob: Problem, machine: Machine, configs: list[TPPPDP]) -> list[Row]:
    """Price every configuration; rows in the order given (rank None), infeasible ones (memory) with a reason.
    A structurally impossible configuration raises (see ``check_config``). One ``evaluate`` call per distinct
    (stage depth, recompute), vectorised over the configurations that share it. TFLOP/s counts the recompute
    forward's FLOPs with full recompute (``spec.model_flops``), not the selective one's attention."""
    spec = prob.model
    for c in configs:
        why = check_config(prob, c)
        if why:
            raise PerfModelError(f"TP{c.tp}xPP{c.pp}xDP{c.dp}: {why}")
    groups: dict[tuple[int, str], list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault((stage_layers(spec.layers, c.pp), c.recompute_mode(prob)), []).append(i)
    out: list[Row | None] = [None] * len(configs)
    for (layers, mode), idx in groups.items():
        cs = [configs[i] for i in idx]
        flops = model_flops(spec, prob.batch, mode == "full")
        m = np.array([prob.batch // (c.dp * c.mbs) for c in cs], dtype=np.int64)
        stage = Problem(replace(spec, layers=layers), prob.batch, prob.gpus, prob.dtype,
                        prob.options.with_(zero1_over_d=True, zero=0, recompute=mode == "full"))
        ev = evaluate(stage, machine, Grids.of([(1, c.tp, 1, c.dp) for c in cs]),
                      inflight=np.array([_inflight(c.pp, c.vpp, int(k)) for c, k in zip(cs, m)]),
                      seq_split=np.array([c.tp if c.sp else 1 for c in cs]), microbatches=m,
                      memory_layout="megatron")
        compute, elementwise = ev.compute, ev.extra["elementwise"]
        if mode == "selective":     # one more forward attention per block and micro-batch ("attention" is 3 of them),
            compute = compute + ev.extra["attention"] / 3.0 + ev.extra["scores_fwd"]   # with its S×S kernels
            elementwise = elementwise + ev.extra["scores_fwd"]
        p = np.array([c.pp for c in cs], dtype=float)
        v = np.array([c.vpp for c in cs], dtype=float)
        # one micro-batch's slot: the step's compute less its optimizer step (once per step, after the pipeline)
        t_mb = (compute - ev.extra["optimizer"] + ev.exposed["x"] + ev.exposed["y"] + ev.exposed["z"]) / m
        send = np.array([c.mbs * spec.seq * spec.hidden * prob.dtype_bytes / c.tp for c in cs])   # [mbs·S, h/t]
        a, be, _ = ring_alpha_beta(np.full(len(cs), 2), np.array([c.tp * c.dp for c in cs]), machine)
        p2p = np.where(p > 1, (m + (p - 1) / v) * 2.0 * v * (send / be + a), 0.0)
        bubble = (p - 1) / v * t_mb
        time = compute + sum(ev.exposed[d] for d in GROUPS) + bubble + p2p
        for j, (i, c) in enumerate(zip(idx, cs)):
            ok = bool(ev.feasible[j])
            tf = flops / float(time[j]) / prob.gpus / 1e12 if ok else 0.0
            out[i] = Row(
                rank=None, grid=(1, c.tp, 1, c.dp), feasible=ok, reason=ev.reasons[j],
                time_s=float(time[j]) if ok else np.inf, tflops_per_gpu=tf,
                pct_peak=100.0 * tf * 1e12 / machine.peak_flops(prob.dtype),
                memory_bytes=float(ev.memory.total[j]), microbatches=int(m[j]), compute_s=float(compute[j]),
                exposed_s={d: float(ev.exposed[d][j]) for d in GROUPS},
                raw_comm_s={d: float(ev.raw[d][j]) for d in GROUPS},
                step_bytes={d: float(ev.step_bytes[d][j]) for d in GROUPS},
                memory_parts={"static": float(ev.memory.static[j]), "buffers": float(ev.memory.buffers[j]),
                              "activations": float(ev.memory.activations[j])},
                dp_buckets=int(ev.extra["dp_buckets"][j]), layout="TPxPPxDP", pp=c.pp, vpp=c.vpp, sp=c.sp,
                bubble_s=float(bubble[j]), p2p_s=float(p2p[j]), elementwise_s=float(elementwise[j]),
                recompute="" if c.recompute is None else mode)
    return out  # type: ignore[return-value]


def enumerate_configs(prob: Problem, machine: Machine) -> list[TPPPDP]:
    """Every TP (dividing the node, hidden and every size the tensor-parallel split divides: heads, key-value heads,
    MLP width, vocab) × PP (≤ layers) × DP with a micro-batch
    size from ``MICROBATCH_SIZES`` that splits the batch, × VPP (``VPP_CHOICES``, where allowed) × SP on/off."""
    spec = prob.model
    out = []
    for t in divisors(machine.gpus_per_node).tolist():
        if prob.gpus % t or any(value % t for _, value, dim in spec.grid_rules() if dim == "y") or spec.hidden % t:
            continue
        for p in divisors(prob.gpus // t).tolist():
            if p > spec.layers:
                continue
            d = prob.gpus // (t * p)
            for mbs in MICROBATCH_SIZES:
                for v in VPP_CHOICES:
                    for sp in ((False, True) if t > 1 else (False,)):
                        c = TPPPDP(t, p, d, mbs, v, sp)
                        if not check_config(prob, c):
                            out.append(c)
    return out


def best_of(rows: list[Row]) -> list[Row]:
    """Rows ordered by time (feasible first), ties by (TP, PP, DP, VPP, SP, micro-batches)."""
    return sorted(rows, key=lambda r: (not r.feasible, r.time_s, r.grid[1], r.pp, r.grid[3], r.vpp, r.sp,
                                       r.microbatches))


def price_named(prob: Problem, machine: Machine, tp: int, pp: int, dp: int, vpp: int = 1, sp: bool = False,
                mbs: int | None = None, recompute: str | None = None) -> Row:
    """One named TP×PP×DP configuration; without ``mbs`` the micro-batch size that prices fastest; ``recompute``
    as ``TPPPDP.recompute``."""
    sizes = [mbs] if mbs is not None else [s for s in MICROBATCH_SIZES if prob.batch % (dp * s) == 0]
    if not sizes:
        raise PerfModelError(f"batch {prob.batch} is not divisible by DP={dp} times any micro-batch size in "
                             f"{MICROBATCH_SIZES}")
    cands = [TPPPDP(tp, pp, dp, s, vpp, sp, recompute) for s in sizes]
    why = [check_config(prob, c) for c in cands]
    ok = [c for c, w in zip(cands, why) if not w]
    if not ok:
        raise PerfModelError(f"TP{tp}xPP{pp}xDP{dp}: {why[0]}")
    return best_of(price(prob, machine, ok))[0]
