"""The performance model: time, memory and feasibility of N grid configurations at once (numpy arrays [N]).

Time per batch = microbatches × (forward + backward) + exposed data-parallel communication. One micro-batch's
forward and backward, a loop over the spec's FC layers with their collectives and overlap chains, and the GPT's
other collectives: ``perfmodel.microbatch``.
Over d (:func:`_data_parallel`) every parameter's gradient (embedding tables, layer norms, FC weight shards and
biases) is packed into buckets of ``Options.bucket_bytes`` as the runtime lays them out (``perfmodel.buckets``:
reverse ``model.parameters()`` order), each bucket one ring collective paying its latency once: with ``zero=0``
an all-reduce (2(Gd−1)·α); with ``zero`` >= 1 a reduce-scatter of the bucket padded to a multiple of Gd ((Gd−1)·α;
every micro-batch with ``zero=2``) and, after the optimizer step, an all-gather of the parameters: the same bytes
on a ring as the all-reduce, with another overlap. With ODP the gradient buckets hide under the slack left in the
(each) micro-batch's backward windows, except the last bucket, posted at the end of the backward, which is
exposed; the parameter all-gathers hide under the next step's forward, except the first bucket it needs.
With ``Options.clip`` (the drivers' default) the step's gradient clipping all-reduces one fp64 number over the block
x·y·z, and over d with ``zero`` >= 1 (:func:`_clipping`): blocking, latency only, counted in the group "xyz"
(``comm.GROUPS``) and in d.
``Options.zero`` None: per grid the fastest mode that fits (:func:`evaluate`).
Element-wise kernels (``compute.elementwise_bytes``: layer norms, residual adds, bias + GELU, with the options' dropout
and unfused attention their S×S traffic) on the runtime's per-rank activations ([m', h/Gx] replicated over y, the
MLP hidden [m', 4h/Gy], H/Gy heads; the stream divided by ``seq_split`` for sequence-parallel stages) move their
bytes through HBM at the machine's ``hbm_bandwidth``: 3× the forward's bytes per block (forward + a backward of
twice them), 4× with recompute; serial with the GEMMs, counted in compute, and hiding no collective. Zero on a
machine without ``hbm_bandwidth``. The head's softmax/cross entropy and the embeddings are not counted.
Not modelled: the optimizer step (with ``zero`` >= 1 it runs on 1/Gd of the elements), contention between
different dimensions' rings, GEMM operand layouts. Pipeline parallelism (Megatron-style TP×PP×DP) is priced on top
of this by ``perfmodel.pipeline``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace

import numpy as np

from axgrid.spec import TransformerShape, ceil_div

from .buckets import BucketTotals, pack
from .parameters import gradient_elements
from .comm import (CLIP_NORM_BYTES, DIMS, PARAM_BYTES, USED_FLAG_BYTES, collective_time, ring_alpha_beta,
                   ring_time)
from .compute import (BLOCK_KERNELS_FUSED, BLOCK_KERNELS_UNFUSED, CROSS_ENTROPY_BYTES, DECODER_KERNELS_BESIDES_NORMS,
                      OPTIMIZER_BYTES, OUTER_KERNELS, elementwise_bytes, memory_time)
from .context_parallel import cp_bytes, cp_time
from .step import STAT_BYTES, loss_elements
from .machines import Machine
from .memory import Memory, memory_per_gpu
from .moe import expert_elementwise_bytes, expert_elements, expert_kernels, price_moe, with_expert_memory
from .microbatch import (CommTally, LayerCost, Rings, add_side, attention_time, backward, forward, layer_costs,
                         norm_volumes, side_costs, table_bytes)
from .space import Grids, describe, divisibility
from .problem import Options, Problem, model_flops


@dataclass
class Evaluation:
    """Per-configuration results (arrays [N]); ``reasons[i]`` is "" for a feasible configuration."""

    grids: Grids
    feasible: np.ndarray
    reasons: list[str]
    microbatches: np.ndarray
    time: np.ndarray
    compute: np.ndarray
    exposed: dict[str, np.ndarray]
    raw: dict[str, np.ndarray]
    step_bytes: dict[str, np.ndarray]
    memory: Memory
    memory_limit: float
    flops: float
    peak: float
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def tflops_per_gpu(self) -> np.ndarray:
        n = int(self.grids.gx[0] * self.grids.gy[0] * self.grids.gz[0] * self.grids.gd[0]) if len(self.grids) else 1
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.time > 0, self.flops / self.time / n / 1e12, 0.0)

    @property
    def pct_peak(self) -> np.ndarray:
        return 100.0 * self.tflops_per_gpu * 1e12 / self.peak


# ---------------------------------------------------------------- data parallel, element-wise, bytes, feasibility


def _choose_microbatches(prob: Problem, machine: Machine, g: Grids, inflight=1.0,
                         seq_split=1, fixed: np.ndarray | None = None,
                         memory_layout: str = "axgrid") -> tuple[np.ndarray, np.ndarray]:
    """Per grid: the fewest micro-batches (from the options) that divide the local batch and fit in memory;
    returns (choice, valid) where valid is False when no choice divides (then choice = the first candidate).
    ``fixed`` [N]: the micro-batch count of every grid, given (valid where it splits the batch)."""
    opt, spec = prob.options, prob.model
    if fixed is not None:
        fixed = np.asarray(fixed, dtype=np.int64)
        ok = (prob.batch % (g.gd * fixed) == 0) & ((prob.batch // fixed) % np.maximum(g.gd * g.gz // opt.cp, 1) == 0)
        return fixed, ok
    choices = [opt.microbatches] if opt.microbatches is not None else list(opt.microbatch_choices)
    limit = opt.memory_usable * machine.memory_bytes
    chosen = np.zeros(len(g), dtype=np.int64)
    valid = np.zeros(len(g), dtype=bool)
    fallback = np.zeros(len(g), dtype=np.int64)
    for c in choices:
        ok = (prob.batch % (g.gd * c) == 0) & ((prob.batch // c) % np.maximum(g.gd * g.gz // opt.cp, 1) == 0)   # whole sequences
        if prob.batch % c:
            ok[:] = False
        mprime = np.where(ok, (prob.batch // c) * spec.seq / (g.gd * g.gz), 1.0)
        mem = memory_per_gpu(spec, g.gx, g.gy, g.gz, g.gd, mprime, prob.dtype_bytes, prob.dtype == "fp32", opt,
                             inflight, seq_split, memory_layout)
        mem = with_expert_memory(mem, spec, g.gx, g.gy, g.gz, g.gd, g.eps, mprime, prob.dtype_bytes, opt)
        fits = ok & (mem.total <= limit)
        pick = fits & (chosen == 0)
        chosen[pick] = c
        first_ok = ok & (fallback == 0)
        fallback[first_ok] = c
        valid |= ok
    # configs where nothing fits: report with the largest dividing choice (least memory)
    last = np.zeros(len(g), dtype=np.int64)
    for c in choices:
        ok = (prob.batch % (g.gd * c) == 0) & ((prob.batch // c) % np.maximum(g.gd * g.gz // opt.cp, 1) == 0)
        if prob.batch % c == 0:
            last[ok] = c
    chosen = np.where(chosen > 0, chosen, np.where(last > 0, last, choices[0]))
    return chosen, valid


def _data_parallel(spec: TransformerShape, costs: list[LayerCost], hx: np.ndarray, g: Grids, grad_bytes: int,
                   opt: Options, rings: Rings, slack: np.ndarray, fwd_window: np.ndarray, mb: np.ndarray,
                   comm: CommTally) -> tuple[BucketTotals, np.ndarray]:
    """(the buckets, bytes over d per step [N]) of the data-parallel collectives in ``opt.zero``'s mode; adds their
    seconds to ``comm`` (dimension d, per step). Gradient elements of ``grad_bytes`` (``Options.grad_reduce``),
    parameters of :data:`PARAM_BYTES` (what the runtime keeps), one ring per bucket paying its latency once:

    - zero 0: an all-reduce per bucket; with ODP hidden under the last micro-batch's backward ``slack`` except the
      last bucket (the embeddings', final at the end of the backward);
    - zero 1: a reduce-scatter per bucket (padded to a multiple of Gd), hidden like the all-reduce, then an
      all-gather of the parameters per bucket after the optimizer step: with ODP under the next step's first
      forward (``fwd_window``, its compute) except the first bucket it needs (the embeddings'), else exposed;
    - zero 2: the reduce-scatters in every micro-batch's backward (``mb`` of them, each hidden under its own
      backward's slack with ODP), the all-gather as zero 1;
    - every mode: one all-reduce of an int32 flag per parameter (:data:`perfmodel.comm.USED_FLAG_BYTES`), blocking."""
    zero, gb = opt.zero, grad_bytes
    elems = gradient_elements(spec, g.gx, g.gy, g.gz)
    bt = pack(elems, gb, opt.bucket_bytes, g.gd if zero else 1)
    # which parameters some d-rank has a gradient for: one int32 per parameter, all-reduced (blocking) after the
    # buckets (zero 0) or at the optimizer's step (zero >= 1)
    flags = USED_FLAG_BYTES * sum((e > 0).astype(np.int64) for e in elems)
    t_flags = np.where(g.gd > 1, rings.time("all_reduce", "d", flags), 0.0)
    comm.add("d", t_flags, t_flags)
    a_d, be_d, _ = rings.ab["d"]
    p = rings.geo["d"][0].astype(float)

    def ring(op: str, nbytes: np.ndarray, calls) -> np.ndarray:
        return collective_time(op, p, nbytes, a_d, be_d, rings.machine, calls)

    if zero == 0:
        ard = ring("all_reduce", bt.numel * gb, bt.count)
        comm.add("d", np.maximum(ring("all_reduce", bt.last * gb, 1), ard - slack) if opt.overlap_dp else ard, ard)
        return bt, bt.numel * float(gb) + flags
    rs = ring("reduce_scatter", bt.padded * gb, bt.count)
    ag = ring("all_gather", bt.padded * PARAM_BYTES, bt.count)
    n_rs = mb if zero == 2 else 1
    if opt.overlap_dp:
        rs_exposed = n_rs * np.maximum(ring("reduce_scatter", bt.last * gb, 1), rs - slack)
        ag_exposed = np.maximum(ring("all_gather", bt.last * PARAM_BYTES, 1), ag - fwd_window)
    else:
        rs_exposed, ag_exposed = n_rs * rs, ag
    comm.add("d", rs_exposed + ag_exposed, n_rs * rs + ag)
    return bt, n_rs * bt.padded * float(gb) + bt.padded * float(PARAM_BYTES) + flags


def _clipping(g: Grids, opt: Options, machine: Machine, rings: Rings, comm: CommTally) -> dict[str, np.ndarray]:
    """Bytes per step [N] by group of the gradient clipping (``opt.clip``; ``comm.clip_events``): the fp64 squared
    norm all-reduced over the block x·y·z (a ring of Gx·Gy·Gz ranks, spanning d's too when the rank order puts d
    inside it), and with ``zero`` >= 1 over d; adds their seconds to ``comm`` (blocking: the gradients' scale
    waits for the norm)."""
    p = g.gx * g.gy * g.gz
    on = {"xyz": (p > 1) & opt.clip, "d": (g.gd > 1) & bool(opt.clip and opt.zero)}
    order = opt.order
    stride = g.gd if order.index("d") < max(order.index(c) for c in "xyz") else np.ones_like(g.gd)
    a, be, _ = ring_alpha_beta(p, stride, machine)
    t = {"xyz": ring_time("all_reduce", p, CLIP_NORM_BYTES, a, be),
         "d": rings.time("all_reduce", "d", CLIP_NORM_BYTES)}
    for k, posted in on.items():
        comm.add(k, np.where(posted, t[k], 0.0), np.where(posted, t[k], 0.0))
    return {k: np.where(posted, float(CLIP_NORM_BYTES), 0.0) for k, posted in on.items()}


def _elementwise(spec: TransformerShape, g: Grids, mprime: np.ndarray, hx: np.ndarray, seq_split, dtype_bytes: int,
                 opt: Options, machine: Machine, layout: str = "axgrid") -> tuple[np.ndarray, np.ndarray]:
    """(all blocks' element-wise kernels, one block's forward attention-score kernels) [N], seconds per
    micro-batch, moving ``compute.elementwise_bytes`` through HBM: 3× a block's forward bytes (4× with recompute).
    A Hugging Face decoder on the 4D runtime (``layout`` "axgrid") runs its norms and gated activation op by op
    (eager, as its plans run transformers' modules); Megatron's layout fuses them."""
    rope = 0.0 if spec.is_gpt else (spec.heads + spec.kv_heads) * spec.head_dim / g.gy
    ew_stream, ew_scores = elementwise_bytes(mprime, hx / np.asarray(seq_split, float), spec.ffn / g.gy,
                                             spec.heads / g.gy, spec.attended_keys(), dtype_bytes, opt.dropout,
                                             opt.fused_attention, spec.block_norms(), spec.gated_mlp, rope,
                                             eager=not spec.is_gpt and layout == "axgrid")
    scores_fwd = memory_time(ew_scores, machine)
    return spec.layers * (3 + int(opt.recompute)) * (memory_time(ew_stream, machine) + scores_fwd), scores_fwd


def host_bound(device: np.ndarray, host: np.ndarray, machine: Machine) -> np.ndarray:
    """A micro-batch's seconds [N] from the GPU's ``device`` time and the ``host``'s (launching its kernels): the
    host launches ahead of the GPU, so the larger of the two -- near the crossover some kernels wait on the host and
    others on the GPU, a smooth maximum (device^k + host^k)^(1/k) with ``Machine.host_device_exponent`` k
    (0: the plain maximum)."""
    k = machine.host_device_exponent
    if k <= 0:
        return np.maximum(device, host)
    top = np.maximum(np.maximum(device, host), 1e-300)
    return top * ((device / top) ** k + (host / top) ** k) ** (1.0 / k)


def _kernel_latency(spec: TransformerShape, opt: Options, machine: Machine, n: int) -> np.ndarray:
    """Seconds [N] per micro-batch that the kernels' launch and synchronisation add (``Machine.kernel_latency``
    times the kernels: ``compute.BLOCK_KERNELS_*`` per block forward, again with recompute, twice in the backward;
    ``compute.OUTER_KERNELS`` for the embedding, head and loss, twice in the backward); 0 without the figure."""
    unfused = opt.dropout or not opt.fused_attention
    if spec.is_gpt:
        per_fwd = BLOCK_KERNELS_UNFUSED if unfused else BLOCK_KERNELS_FUSED
    else:
        per_fwd = (len(spec.block_layers()) + spec.block_norms() + DECODER_KERNELS_BESIDES_NORMS
                   + (BLOCK_KERNELS_UNFUSED - BLOCK_KERNELS_FUSED if unfused else 0))
    kernels = spec.layers * per_fwd * (3 + int(opt.recompute)) + 3 * OUTER_KERNELS
    return np.full(n, kernels * machine.kernel_latency)


def _optimizer_time(spec: TransformerShape, g: Grids, opt: Options, machine: Machine, layout: str) -> np.ndarray:
    """Seconds [N] of the optimizer step: the parameters one GPU updates (its x·y·z shard of the model, and of that
    its d-share when the optimizer state is sharded over d) times ``compute.OPTIMIZER_BYTES`` through HBM."""
    sharded = bool(opt.zero1_over_d or opt.zero)
    experts = expert_elements(spec, g.gx, g.gy, g.gz, g.eps) if spec.is_moe else 0.0   # over Gd/ep replicas
    dense = (spec.params - spec.moe_layers * spec.experts * sum(layer.n * layer.k for layer in spec.expert_layers())
             ) / (g.gx * g.gy * g.gz)
    local = dense / (g.gd if sharded else 1) + experts / (g.gd / g.eps if sharded else 1)
    return memory_time(local * OPTIMIZER_BYTES[layout], machine)


def _step_bytes(spec: TransformerShape, costs: list[LayerCost], g: Grids, mb: np.ndarray, mp_int: np.ndarray,
                hx: np.ndarray, d_bytes: np.ndarray, dtype_bytes: int, opt: Options) -> dict[str, np.ndarray]:
    """Bytes per grid dimension per step [N], as the runtime's ledger counts them (a dimension of size 1 posts
    nothing), by grid dimension: each FC layer's collectives (weights gathered and activations reduced in the problem's dtype, gradients
    in ``opt.grad_bytes``), the GPT's fp32 side collectives, the data-parallel buckets."""
    b, gb = dtype_bytes, opt.grad_bytes
    step_bytes = {d: np.zeros(len(g)) for d in DIMS}
    size = {"x": g.gx, "y": g.gy, "z": g.gz, "d": g.gd}
    on = {d: (size[d] > 1).astype(float) for d in DIMS}
    for c in costs:
        v = c.vol
        n_fwd = 1 + int(opt.recompute and c.layer.recompute)
        step_bytes[v.fwd_ar_dim] += c.reps * mb * n_fwd * v.fwd_ar * b * on[v.fwd_ar_dim]
        step_bytes[v.bwd_ar_dim] += c.reps * mb * v.bwd_ar * b * on[v.bwd_ar_dim]
        n_ag = n_fwd + int(not opt.keep_gathered)
        step_bytes["z"] += c.reps * mb * (n_ag * v.padded * b + (v.padded + v.bias_loc) * gb) * on["z"]
    n_ln = spec.layer_norms()
    n_ln_fwd = n_ln + (spec.layers * spec.block_norms() if opt.recompute else 0)
    calls, fwd, bwd_x, bwd_z = norm_volumes(spec, mp_int, hx)
    step_bytes["x"] += mb * (calls * n_ln_fwd * fwd + n_ln * bwd_x) * STAT_BYTES * on["x"]
    step_bytes["y"] += mb * (g.gy + 2) * mp_int * STAT_BYTES * on["y"]
    step_bytes["z"] += mb * (n_ln * bwd_z + loss_elements(spec)) * STAT_BYTES * on["z"]
    if spec.head_norms and not opt.lora_r:      # q_norm, k_norm: each weight's gradient over y, then z (fp32)
        width = sum(spec.head_norm_widths())
        step_bytes["y"] += mb * spec.layers * width * STAT_BYTES * on["y"]
        step_bytes["z"] += mb * spec.layers * width * STAT_BYTES * on["z"]
    for _, dim, nbytes in table_bytes(spec, mp_int, hx, costs[-1].vol.padded, b, gb):
        step_bytes[dim] += mb * nbytes * on[dim]
    step_bytes["d"] += d_bytes * on["d"]
    return step_bytes


def _infeasibility(prob: Problem, g: Grids, mem: Memory, limit: float, mb: np.ndarray,
                   mb_valid: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(infeasible [N], reasons): a grid is infeasible when a size does not divide (``space.divisibility``), no
    micro-batch count splits the batch, or its memory exceeds ``limit`` bytes; its reason names the sizes that do
    not divide, else the micro-batch split, else the memory ("" for a feasible grid)."""
    spec, opt = prob.model, prob.options
    bad = divisibility(spec, prob.batch, g, opt.microbatches, opt.cp)
    bad["microbatches"] = ~mb_valid
    if opt.zero:
        bad["zero"] = g.gd == 1
    over = mem.total > limit
    infeasible = over.copy()
    for v in bad.values():
        infeasible |= v
    reasons = [""] * len(g)
    tuples = None
    for i in np.nonzero(infeasible)[0].tolist():
        tuples = tuples or g.tuples()
        why = [describe(k, spec, prob.batch, tuples[i] + (int(g.eps[i]),), opt.microbatches) for k, v in bad.items()
               if v[i] and k not in ("microbatches", "zero")]
        if "zero" in bad and bad["zero"][i]:
            why.append(f"zero={opt.zero} needs Gd > 1 (nothing to shard over d)")
        if bad["microbatches"][i] and not why:
            why.append(f"no micro-batch count in {list(opt.microbatch_choices)} splits the batch evenly")
        if not why and over[i]:
            why.append(f"memory {mem.total[i] / 2**30:.1f} GiB > {limit / 2**30:.1f} GiB usable "
                       f"(with {int(mb[i])} micro-batches{f', zero={opt.zero}' if opt.zero else ''})")
        reasons[i] = "; ".join(why)
    return infeasible, reasons


def evaluate(prob: Problem, machine: Machine, grids: Grids, inflight=1.0, seq_split=1,
             microbatches: np.ndarray | None = None, memory_layout: str = "axgrid") -> Evaluation:
    """Model every configuration in ``grids`` for ``prob`` on ``machine``. For pipeline stages
    (``perfmodel.pipeline``), per grid (scalars or arrays [N]): ``inflight`` and ``seq_split`` change the activation
    memory (micro-batches in flight, sequence parallelism; see ``memory.memory_per_gpu``), ``seq_split`` also the
    element-wise kernels' stream width, and ``microbatches`` fixes each grid's micro-batch count;
    ``memory_layout``: "axgrid" (the runtime's) or "megatron" (``memory.memory_per_gpu``).

    ``prob.options.zero`` None: each grid gets the ``zero`` mode (0, 1, 2) with the fastest feasible time (ties:
    the lower mode; none feasible: the one needing the least memory, whose reason is reported); the choice is
    ``extra["zero"]``."""
    if prob.options.zero is not None:
        return _evaluate(prob, machine, grids, inflight, seq_split, microbatches, memory_layout)
    evs = [_evaluate(replace(prob, options=prob.options.with_(zero=z)), machine, grids, inflight, seq_split,
                     microbatches, memory_layout) for z in (0, 1, 2)]
    time = np.stack([e.time for e in evs])             # inf where infeasible
    mem = np.stack([e.memory.total for e in evs])
    feasible = np.isfinite(time).any(axis=0)
    pick = np.where(feasible, np.argmin(time, axis=0), np.argmin(mem, axis=0))
    return _select(evs, pick)


def _select(evs: list[Evaluation], pick: np.ndarray) -> Evaluation:
    """Per grid, the evaluation ``pick`` [N] names (an index into ``evs``)."""
    def one(arrs):
        return np.choose(pick, [np.asarray(a) for a in arrs])

    def fields(objs, cls):
        return cls(**{f.name: (None if getattr(objs[0], f.name) is None else one([getattr(o, f.name) for o in objs]))
                      for f in dataclasses.fields(cls)})

    first = evs[0]
    return Evaluation(
        grids=first.grids, feasible=one([e.feasible for e in evs]).astype(bool),
        reasons=[evs[k].reasons[i] for i, k in enumerate(pick.tolist())],
        microbatches=one([e.microbatches for e in evs]), time=one([e.time for e in evs]),
        compute=one([e.compute for e in evs]),
        exposed={d: one([e.exposed[d] for e in evs]) for d in first.exposed},
        raw={d: one([e.raw[d] for e in evs]) for d in first.raw},
        step_bytes={d: one([e.step_bytes[d] for e in evs]) for d in first.step_bytes},
        memory=fields([e.memory for e in evs], Memory), memory_limit=first.memory_limit, flops=first.flops,
        peak=first.peak, extra={k: one([e.extra[k] for e in evs]) for k in first.extra})


def _evaluate(prob: Problem, machine: Machine, grids: Grids, inflight, seq_split, microbatches,
              memory_layout: str) -> Evaluation:
    """:func:`evaluate` for one ``zero`` mode."""
    spec, opt, g, b = prob.model, prob.options, grids, prob.dtype_bytes
    mb, mb_valid = _choose_microbatches(prob, machine, g, inflight, seq_split, microbatches, memory_layout)
    mprime = (prob.batch // mb) * spec.seq / (g.gd * g.gz)  # float tokens per GPU per micro-batch
    mp_int = np.maximum(np.floor(mprime), 1).astype(np.int64)
    hx = ceil_div(spec.hidden, g.gx)
    rings = Rings.of(g, opt.order, machine)
    att = attention_time(spec, g, mprime, machine, prob.dtype)
    costs = layer_costs(spec, g, mprime, mp_int, b, machine, prob.dtype, rings, att, opt.grad_bytes)
    side = side_costs(spec, g, mp_int, hx, rings, costs[-1].vol.padded, b, opt.grad_bytes)

    comm = CommTally.zeros(len(g))      # x, y, z per micro-batch (times mb below), d per step
    compute_fwd = forward(costs, spec.layers, opt, comm)
    add_side(spec, side, opt, comm)
    compute_bwd, slack = backward(spec, costs, side, opt, comm)
    buckets, d_bytes = _data_parallel(spec, costs, hx, g, opt.grad_bytes, opt, rings, slack, compute_fwd, mb, comm)
    clip_bytes = _clipping(g, opt, machine, rings, comm)
    elementwise, scores_fwd = _elementwise(spec, g, mprime, hx, seq_split, b, opt, machine, memory_layout)
    kernels = _kernel_latency(spec, opt, machine, len(g))
    # the routed experts (perfmodel.moe; nothing for a dense model): GEMMs, collectives, all-to-alls, kernels
    moe = price_moe(spec, g, g.eps, mprime, mp_int, mb, b, opt.grad_bytes, opt, machine, prob.dtype)
    compute_fwd, compute_bwd = compute_fwd + moe.fwd, compute_bwd + moe.bwd
    for d in ("x", "y", "z"):
        comm.add(d, moe.exposed[d], moe.raw[d])
    comm.add("d", mb * moe.exposed["d"] + moe.exposed["d_step"], mb * moe.raw["d"] + moe.raw["d_step"])
    passes = 3 + int(opt.recompute)
    elementwise = elementwise + spec.moe_layers * passes * memory_time(
        expert_elementwise_bytes(spec, g.gx, g.gy, mprime, b), machine)
    kernels = kernels + spec.moe_layers * passes * expert_kernels(spec, g.eps) * machine.kernel_latency
    loss = memory_time(mprime * spec.vocab / g.gy * CROSS_ENTROPY_BYTES, machine)
    optimizer = _optimizer_time(spec, g, opt, machine, memory_layout)
    device = compute_fwd + compute_bwd + elementwise + loss
    compute = mb * host_bound(device, kernels, machine) + optimizer
    exposed, raw = comm.exposed, comm.raw
    for d in ("x", "y", "z"):
        exposed[d] = exposed[d] * mb
        raw[d] = raw[d] * mb
    if opt.cp > 1:                                      # context parallelism: perfmodel.context_parallel
        cp_compute, cp_exposed, cp_raw = cp_time(spec, g.gy, g.gz, mprime, opt.cp, opt.cp_exchange, opt.recompute,
                                                 prob.dtype, b, machine, rings, rings.geo["z"][1], att)
        compute = compute + mb * cp_compute
        exposed["c"], raw["c"] = mb * cp_exposed, mb * cp_raw
    time = compute + sum(exposed.values())

    mem = memory_per_gpu(spec, g.gx, g.gy, g.gz, g.gd, mprime, b, prob.dtype == "fp32", opt, inflight, seq_split,
                         memory_layout)
    mem = with_expert_memory(mem, spec, g.gx, g.gy, g.gz, g.gd, g.eps, mprime, b, opt)
    limit = opt.memory_usable * machine.memory_bytes
    infeasible, reasons = _infeasibility(prob, g, mem, limit, mb, mb_valid)
    step_bytes = _step_bytes(spec, costs, g, mb, mp_int, hx, d_bytes, b, opt)
    for d in DIMS:
        step_bytes[d] = step_bytes[d] + moe.step_bytes[d]
    step_bytes["xyz"] = clip_bytes["xyz"]
    step_bytes["d"] = step_bytes["d"] + clip_bytes["d"]
    if opt.cp > 1:
        step_bytes["c"] = mb * cp_bytes(spec, g.gy, mp_int, b, opt.cp, opt.cp_exchange, opt.recompute)
    return Evaluation(
        grids=g, feasible=~infeasible, reasons=reasons, microbatches=mb, time=np.where(infeasible, np.inf, time),
        compute=compute, exposed=exposed, raw=raw,
        step_bytes=step_bytes, memory=mem, memory_limit=limit,
        flops=model_flops(spec, prob.batch, opt.recompute), peak=machine.peak_flops(prob.dtype),
        extra={"compute_fwd": mb * compute_fwd, "compute_bwd": mb * compute_bwd,
               "attention": mb * 3 * spec.layers * att, "elementwise": mb * elementwise,
               "kernels": mb * kernels, "loss": mb * loss, "optimizer": optimizer,
               "scores_fwd": mb * spec.layers * scores_fwd, "dp_buckets": np.where(g.gd > 1, buckets.count, 0),
               "zero": np.full(len(g), opt.zero), "ep": g.eps,
               "all_to_all": moe.all_to_all_s, "all_to_all_bytes": moe.all_to_all_bytes},
    )
