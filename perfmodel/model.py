"""The performance model: time, memory and feasibility of N grid configurations at once (numpy arrays [N]).

Time per batch = microbatches × (forward + backward) + exposed data-parallel all-reduce.
Forward of layer j: GEMM (+ attention after QKV); AG_z(j) is hidden under layer j−1's forward when OAG is on
(the first layer's is exposed); the output all-reduce is blocking. Backward (reverse order): AG_z again unless
keep_gathered (blocking); with recompute the whole block's forward (its AG_z, prefetched in order with OAG, and
its output all-reduces) is redone before MLP-down's backward; the input-gradient all-reduce hides under the dW
GEMM when OAR is on; RS_z(j) hides under the rest of the backward compute of the next layer processed when ORS is
on (the last one is exposed); the bias AR_z is blocking. Each window of compute hides at most one collective, so
the model is monotone: more bandwidth or more FLOP/s never predicts a slower step.
The GPT's other collectives (``perfmodel.gpt``: layer-norm statistics AR_x and gradient AR_z, the embedding
tables' gradient AR_z, the vocabulary-parallel cross entropy's AG_y and AR_y, the loss AR_z; all fp32) are priced
per call, as blocking; with ORS the layer norms' AR_z (one call each for weight and bias, as the runtime posts it)
join the reduce-scatter of the layer before them in the ORS chain and hide under the same window, while the
embeddings' AR_z, posted last in the backward, stay exposed.
AR_d (once per step) is priced per bucket, as the runtime posts it: every parameter's gradient (embedding tables,
layer norms, FC weight shards and biases) is packed into buckets of ``Options.bucket_bytes`` exactly as
``axgrid.sync_gradients`` packs them (``model.parameters()`` order), or with ODP as ``GradientPipeline`` does (in
the order gradients become final, ``gpt.gpt_step``), and each bucket is one ring all-reduce over d paying
2(Gd−1)·α once (see ``comm.dp_buckets``). With ODP the buckets hide under the slack left in the last
micro-batch's backward windows, except the last bucket, posted at the end of the backward, which is exposed.
Element-wise kernels (``compute.elementwise_bytes``: layer norms, residual adds, bias + GELU, with the options' dropout
and unfused attention their S×S traffic) on the runtime's per-rank activations ([m', h/Gx] replicated over y, the
MLP hidden [m', 4h/Gy], H/Gy heads; the stream divided by ``seq_split`` for sequence-parallel stages) move their
bytes through HBM at the machine's ``hbm_bandwidth``: 3× the forward's bytes per block (forward + a backward of
twice them), 4× with recompute; serial with the GEMMs, counted in compute, and hiding no collective. Zero on a
machine without ``hbm_bandwidth``. The head's softmax/cross entropy and the embeddings are not counted.
Not modelled: the optimizer step, contention between different dimensions' rings, GEMM
operand layouts. Pipeline parallelism (Megatron-style TP×PP×DP) is priced on top of this by ``perfmodel.pipeline``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from axgrid.spec import ceil_div

from .comm import DIMS, dim_strides, layer_volumes, ring_alpha_beta, ring_time
from .compute import elementwise_bytes, gemm_rate, gemm_time, memory_time
from .gpt import STAT_BYTES, gpt_parameters, gpt_step
from .machines import Machine
from .memory import Memory, memory_per_gpu
from .space import Grids, describe, divisibility
from .spec import Problem, model_flops


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


def _pos(a):
    return np.maximum(a, 0.0)


def _grad_sizes(spec, V, hx, grad_bytes: int) -> dict[str, np.ndarray]:
    """Bytes of each gradient tensor per grid (arrays [N]), by parameter key (see ``perfmodel.gpt``); ``V``: the
    volumes of the block's FC layers and the head, in that order."""
    n = len(V[0].shard)
    names = [layer.name for layer in spec.block_layers() + [spec.head_layer()]]
    out: dict[str, np.ndarray] = {}
    for p in gpt_parameters(spec, (1, 1, 1, 1)):
        if p.kind == "emb":
            rows = spec.vocab if p.key == "wte" else spec.seq
            out[p.key] = rows * hx * grad_bytes
        elif p.kind == "ln":
            out[p.key] = hx * grad_bytes
        else:
            layer, part = p.key.split(".")[-2:]
            v = V[names.index(layer)]
            out[p.key] = (v.shard if part == "w" else v.bias_loc) * grad_bytes
    return {k: np.broadcast_to(np.asarray(a, dtype=np.int64), (n,)) for k, a in out.items()}


def _pack(sizes: list[np.ndarray], bucket_bytes: int, overlap_dp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(buckets, total bytes, bytes of the last bucket posted) per grid: ``comm.dp_buckets`` vectorised."""
    n = np.zeros(len(sizes[0]), dtype=np.int64)
    fill = np.zeros_like(n)
    last = np.zeros_like(n)
    total = np.zeros_like(n)
    for s in sizes:
        total = total + s
        if overlap_dp:              # GradientPipeline: append, post once the bucket holds >= bucket_bytes
            fill = fill + s
            full = (s > 0) & (fill >= bucket_bytes)
            n = n + full
            last = np.where(full, fill, last)
            fill = np.where(full, 0, fill)
        else:                       # sync_gradients: post the open bucket when the tensor would overflow it
            new = (s > 0) & ((fill == 0) | (fill + s > bucket_bytes))
            n = n + new
            fill = np.where(new, s, fill + s)
    if overlap_dp:
        n = n + (fill > 0)
        last = np.where(fill > 0, fill, last)
    else:
        last = fill
    return n, total.astype(float), last.astype(float)


def _dp_buckets(spec, V, hx, gz, b: int, opt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(buckets, total bytes, bytes of the last bucket posted) of the data-parallel gradient all-reduce per grid,
    vectorised over grids: every parameter of the GPT (embeddings, layer norms, FC weight shards and biases)
    packed as ``comm.dp_buckets`` packs them, in ``model.parameters()`` order, or with ODP in the order the
    gradients become final (``gpt.gpt_step``; with ORS that order depends on whether Gz > 1)."""
    size = _grad_sizes(spec, V, hx, b)
    if not opt.overlap_dp:
        return _pack([size[p.key] for p in gpt_parameters(spec, (1, 1, 1, 1))], opt.bucket_bytes, False)
    if opt.overlap_rs:          # with ORS the layer norms and embeddings join the pipeline only when Gz > 1
        variants = [(gz > 1, (1, 1, 2, 1)), (gz == 1, (1, 1, 1, 1))]
    else:
        variants = [(np.ones(len(gz), dtype=bool), (1, 1, 1, 1))]
    out = [np.zeros(len(gz), dtype=np.int64), np.zeros(len(gz)), np.zeros(len(gz))]
    for mask, g in variants:
        if not mask.any():
            continue
        _, ready = gpt_step(spec, g, 1, 1, 4, overlap_rs=opt.overlap_rs)
        res = _pack([size[k] for k in ready], opt.bucket_bytes, True)
        out = [np.where(mask, r, o) for r, o in zip(res, out)]
    return out[0], out[1], out[2]


def _choose_microbatches(prob: Problem, machine: Machine, g: Grids, inflight=1.0,
                         seq_split=1, fixed: np.ndarray | None = None,
                         memory_layout: str = "axgrid") -> tuple[np.ndarray, np.ndarray]:
    """Per grid: the fewest micro-batches (from the options) that divide the local batch and fit in memory;
    returns (choice, valid) where valid is False when no choice divides (then choice = the first candidate).
    ``fixed`` [N]: the micro-batch count of every grid, given (valid where it splits the batch)."""
    opt, spec = prob.options, prob.model
    if fixed is not None:
        fixed = np.asarray(fixed, dtype=np.int64)
        ok = (prob.batch % (g.gd * fixed) == 0) & ((prob.batch // fixed) % (g.gd * g.gz) == 0)
        return fixed, ok
    choices = [opt.microbatches] if opt.microbatches is not None else list(opt.microbatch_choices)
    limit = opt.memory_usable * machine.memory_bytes
    chosen = np.zeros(len(g), dtype=np.int64)
    valid = np.zeros(len(g), dtype=bool)
    fallback = np.zeros(len(g), dtype=np.int64)
    for c in choices:
        ok = (prob.batch % (g.gd * c) == 0) & ((prob.batch // c) % (g.gd * g.gz) == 0)   # whole sequences
        if prob.batch % c:
            ok[:] = False
        mprime = np.where(ok, (prob.batch // c) * spec.seq / (g.gd * g.gz), 1.0)
        mem = memory_per_gpu(spec, g.gx, g.gy, g.gz, g.gd, mprime, prob.dtype_bytes, prob.dtype == "fp32", opt,
                             inflight, seq_split, memory_layout)
        fits = ok & (mem.total <= limit)
        pick = fits & (chosen == 0)
        chosen[pick] = c
        first_ok = ok & (fallback == 0)
        fallback[first_ok] = c
        valid |= ok
    # configs where nothing fits: report with the largest dividing choice (least memory)
    last = np.zeros(len(g), dtype=np.int64)
    for c in choices:
        ok = (prob.batch % (g.gd * c) == 0) & ((prob.batch // c) % (g.gd * g.gz) == 0)
        if prob.batch % c == 0:
            last[ok] = c
    chosen = np.where(chosen > 0, chosen, np.where(last > 0, last, choices[0]))
    return chosen, valid


def evaluate(prob: Problem, machine: Machine, grids: Grids, inflight=1.0, seq_split=1,
             microbatches: np.ndarray | None = None, memory_layout: str = "axgrid") -> Evaluation:
    """Model every configuration in ``grids`` for ``prob`` on ``machine``. For pipeline stages
    (``perfmodel.pipeline``), per grid (scalars or arrays [N]): ``inflight`` and ``seq_split`` change the activation
    memory (micro-batches in flight, sequence parallelism; see ``memory.memory_per_gpu``), ``seq_split`` also the
    element-wise kernels' stream width, and ``microbatches`` fixes each grid's micro-batch count;
    ``memory_layout``: "axgrid" (the runtime's) or "megatron" (``memory.memory_per_gpu``)."""
    spec, opt, dt = prob.model, prob.options, prob.dtype
    b = prob.dtype_bytes
    g = grids
    L, h, S = spec.layers, spec.hidden, spec.seq
    mb, mb_valid = _choose_microbatches(prob, machine, g, inflight, seq_split, microbatches, memory_layout)
    mprime = (prob.batch // mb) * S / (g.gd * g.gz)  # float tokens per GPU per micro-batch
    mp_int = np.maximum(np.floor(mprime), 1).astype(np.int64)

    geo = dim_strides(g.gx, g.gy, g.gz, g.gd, opt.order)
    ab = {dim: ring_alpha_beta(p, s, machine) for dim, (p, s) in geo.items()}

    def cost(op: str, dim: str, nbytes):
        a, be, _ = ab[dim]
        return ring_time(op, geo[dim][0], nbytes, a, be)

    # per layer type (QKV, out, up, down, head) collective and GEMM times per micro-batch
    layers = spec.block_layers() + [spec.head_layer()]
    reps = [L, L, L, L, 1]
    V = [layer_volumes(layer, g.gx, g.gy, g.gz, mp_int) for layer in layers]
    F = [gemm_time(mprime, v.n_loc, v.k_loc, machine, dt) for v in V]
    DX = [gemm_time(mprime, v.k_loc, v.n_loc, machine, dt) for v in V]
    DW = [gemm_time(v.n_loc, v.k_loc, mprime, machine, dt) for v in V]
    dh = h // spec.heads
    att = 4.0 * mprime * S * h / g.gy / gemm_rate(S, S, dh, machine, dt)  # forward attention, replicated over x
    AG = [cost("all_gather", "z", v.padded * b) for v in V]
    RS = [cost("reduce_scatter", "z", v.padded * b) for v in V]
    ARF = [cost("all_reduce", v.fwd_ar_dim, v.fwd_ar * b) for v in V]
    ARB = [cost("all_reduce", v.bwd_ar_dim, v.bwd_ar * b) for v in V]
    BZ = [cost("all_reduce", "z", v.bias_loc * b) for v in V]
    q, o, u, dn, hd = range(5)
    # the GPT's other collectives per micro-batch (fp32, blocking; see perfmodel.gpt): layer norms, embeddings,
    # vocabulary-parallel cross entropy, loss
    hx = ceil_div(h, g.gx)
    n_ln = 2 * L + 1
    ln_fwd = 2 * cost("all_reduce", "x", mp_int * STAT_BYTES)                  # per layer norm (mean, variance)
    ln_bwd_x = cost("all_reduce", "x", 2 * mp_int * STAT_BYTES)
    ln_bwd_z = cost("all_reduce", "z", 2 * hx * STAT_BYTES)                   # weight and bias in one call
    emb_z = cost("all_reduce", "z", S * hx * STAT_BYTES) + cost("all_reduce", "z", spec.vocab * hx * STAT_BYTES)
    ce_y = (cost("all_gather", "y", g.gy * mp_int * STAT_BYTES) + cost("all_reduce", "y", 2 * mp_int * STAT_BYTES))
    loss_z = cost("all_reduce", "z", np.full(len(g), STAT_BYTES))

    zeros = np.zeros(len(g))
    exposed = {d: zeros.copy() for d in DIMS}
    raw = {d: zeros.copy() for d in DIMS}

    # ---- forward
    f_win = [F[q] + att, F[o], F[u], F[dn], F[hd]]
    compute_fwd = sum(r * w for r, w in zip(reps, f_win))
    if opt.overlap_ag:
        ag_fwd = ((L - 1) * _pos(AG[q] - f_win[dn]) + AG[q] + L * _pos(AG[o] - f_win[q])
                  + L * _pos(AG[u] - f_win[o]) + L * _pos(AG[dn] - f_win[u]) + _pos(AG[hd] - f_win[dn]))
    else:
        ag_fwd = sum(r * a for r, a in zip(reps, AG))
    exposed["z"] += ag_fwd
    raw["z"] += sum(r * a for r, a in zip(reps, AG))
    for i, layer_v in enumerate(V):
        t = reps[i] * ARF[i] * (2 if (opt.recompute and layers[i].recompute) else 1)
        exposed[layer_v.fwd_ar_dim] += t
        raw[layer_v.fwd_ar_dim] += t
    side = {"x": (n_ln + (2 * L if opt.recompute else 0)) * ln_fwd + n_ln * ln_bwd_x,
            "y": ce_y, "z": emb_z + loss_z + (0.0 if opt.overlap_rs else n_ln * ln_bwd_z)}
    for d, t in side.items():
        exposed[d] += t
        raw[d] += t

    # ---- backward
    recomp = (F[q] + att + F[o] + F[u] + F[dn]) if opt.recompute else zeros
    r_win = [DX[q] + 2 * att, DX[o], DX[u], DX[dn] + recomp, DX[hd]]
    compute_bwd = sum(r * (w + dw) for r, w, dw in zip(reps, r_win, DW))
    if not opt.keep_gathered:
        t = sum(r * a for r, a in zip(reps, AG))
        exposed["z"] += t
        raw["z"] += t
    slack = zeros.copy()
    rw = list(r_win)    # the backward windows that hide ORS's reduce-scatters
    if opt.recompute:   # the recompute forward gathers each block's weights again
        ag_rec = sum(L * a for a in AG[:4])
        raw["z"] += ag_rec
        if opt.overlap_ag:
            # prefetched in order: each recompute GEMM window hides the next layer's gather (the last block's
            # first gather is exposed); those windows then hide no reduce-scatter (one collective per window)
            exposed["z"] += (AG[q] + (L - 1) * _pos(AG[q] - f_win[dn]) + L * _pos(AG[o] - f_win[q])
                             + L * _pos(AG[u] - f_win[o]) + L * _pos(AG[dn] - f_win[u]))
            slack += (f_win[dn] + (L - 1) * _pos(f_win[dn] - AG[q]) + L * _pos(f_win[q] - AG[o])
                      + L * _pos(f_win[o] - AG[u]) + L * _pos(f_win[u] - AG[dn]))
            rw[dn] = DX[dn]
        else:
            exposed["z"] += ag_rec
    for i, layer_v in enumerate(V):
        arb = ARB[i]
        raw[layer_v.bwd_ar_dim] += reps[i] * arb
        if opt.overlap_ar:
            exposed[layer_v.bwd_ar_dim] += reps[i] * _pos(arb - DW[i])
            slack += reps[i] * _pos(DW[i] - arb)
        else:
            exposed[layer_v.bwd_ar_dim] += reps[i] * arb
            slack += reps[i] * DW[i]
        exposed["z"] += reps[i] * BZ[i]
        raw["z"] += reps[i] * (BZ[i] + RS[i])
    if opt.overlap_rs:
        # RS(j) hides under the rest-window of the next layer processed: head→down, down→up, up→out, out→qkv,
        # qkv(block b)→down(block b−1); block 0's QKV has nothing left to hide under.
        # the layer norms' z all-reduces go through the same pipeline, right after the layer before them in the
        # backward (head -> ln_f, up -> ln2, qkv -> ln1), and hide under the same window
        rs = list(RS)
        rs[hd], rs[u], rs[q] = RS[hd] + ln_bwd_z, RS[u] + ln_bwd_z, RS[q] + ln_bwd_z
        raw["z"] += n_ln * ln_bwd_z
        exposed["z"] += (_pos(rs[hd] - rw[dn]) + L * _pos(rs[dn] - rw[u]) + L * _pos(rs[u] - rw[o])
                         + L * _pos(rs[o] - rw[q]) + (L - 1) * _pos(rs[q] - rw[dn]) + rs[q])
        slack += (rw[hd] + _pos(rw[dn] - rs[hd]) + (L - 1) * _pos(rw[dn] - rs[q])
                  + L * _pos(rw[u] - rs[dn]) + L * _pos(rw[o] - rs[u]) + L * _pos(rw[q] - rs[o]))
    else:
        exposed["z"] += sum(r * a for r, a in zip(reps, RS))
        slack += sum(r * w for r, w in zip(reps, rw))

    # ---- data parallel, once per step, one all-reduce per gradient bucket
    n_buckets, d_bytes, last_bucket = _dp_buckets(spec, V, hx, g.gz, b, opt)
    a_d, be_d, _ = ab["d"]
    p_d = geo["d"][0].astype(float)
    ring = 2.0 * (p_d - 1)
    ard = np.where(d_bytes > 0, ring / np.maximum(p_d, 1) * d_bytes / be_d + ring * a_d * n_buckets, 0.0)
    raw["d"] += ard
    if opt.overlap_dp:
        t_last = np.where(last_bucket > 0, ring / np.maximum(p_d, 1) * last_bucket / be_d + ring * a_d, 0.0)
        exposed["d"] += np.maximum(t_last, ard - slack)
    else:
        exposed["d"] += ard

    # ---- element-wise kernels per micro-batch (HBM-bound; compute.elementwise_bytes)
    ew_stream, ew_scores = elementwise_bytes(mprime, hx / np.asarray(seq_split, float), 4 * h / g.gy,
                                             spec.heads / g.gy, S, b, opt.dropout, opt.fused_attention)
    ew_fwd_scores = memory_time(ew_scores, machine)
    elementwise = L * (3 + int(opt.recompute)) * (memory_time(ew_stream, machine) + ew_fwd_scores)

    compute = mb * (compute_fwd + compute_bwd + elementwise)
    for d in ("x", "y", "z"):
        exposed[d] = exposed[d] * mb
        raw[d] = raw[d] * mb
    time = compute + sum(exposed.values())

    # bytes per dimension per step (the ledger's totals)
    step_bytes = {d: zeros.copy() for d in DIMS}
    size = {"x": g.gx, "y": g.gy, "z": g.gz, "d": g.gd}
    on = {d: (size[d] > 1).astype(float) for d in DIMS}
    for i, v in enumerate(V):
        n_fwd = 1 + int(opt.recompute and layers[i].recompute)
        step_bytes[v.fwd_ar_dim] += reps[i] * mb * n_fwd * v.fwd_ar * b * on[v.fwd_ar_dim]
        step_bytes[v.bwd_ar_dim] += reps[i] * mb * v.bwd_ar * b * on[v.bwd_ar_dim]
        n_ag = n_fwd + int(not opt.keep_gathered)
        step_bytes["z"] += reps[i] * mb * ((n_ag + 1) * v.padded + v.bias_loc) * b * on["z"]
    n_ln_fwd = n_ln + (2 * L if opt.recompute else 0)
    step_bytes["x"] += mb * (2 * n_ln_fwd + 2 * n_ln) * mp_int * STAT_BYTES * on["x"]
    step_bytes["y"] += mb * (g.gy + 2) * mp_int * STAT_BYTES * on["y"]
    step_bytes["z"] += mb * (n_ln * 2 * hx + (S + spec.vocab) * hx + 1) * STAT_BYTES * on["z"]
    step_bytes["d"] += d_bytes * on["d"]

    # ---- feasibility
    mem = memory_per_gpu(spec, g.gx, g.gy, g.gz, g.gd, mprime, b, dt == "fp32", opt, inflight, seq_split,
                         memory_layout)
    limit = opt.memory_usable * machine.memory_bytes
    bad = divisibility(spec, prob.batch, g, opt.microbatches)
    bad["microbatches"] = ~mb_valid
    over = mem.total > limit
    infeasible = over.copy()
    for v in bad.values():
        infeasible |= v
    reasons = [""] * len(g)
    tuples = None
    for i in np.nonzero(infeasible)[0].tolist():
        tuples = tuples or g.tuples()
        why = [describe(k, spec, prob.batch, tuples[i], opt.microbatches) for k, v in bad.items()
               if v[i] and k != "microbatches"]
        if bad["microbatches"][i] and not why:
            why.append(f"no micro-batch count in {list(opt.microbatch_choices)} splits the batch evenly")
        if not why and over[i]:
            why.append(f"memory {mem.total[i] / 2**30:.1f} GiB > {limit / 2**30:.1f} GiB usable "
                       f"(with {int(mb[i])} micro-batches)")
        reasons[i] = "; ".join(why)
    return Evaluation(
        grids=g, feasible=~infeasible, reasons=reasons, microbatches=mb, time=np.where(infeasible, np.inf, time),
        compute=compute, exposed=exposed, raw=raw, step_bytes=step_bytes, memory=mem, memory_limit=limit,
        flops=model_flops(spec, prob.batch, opt.recompute), peak=machine.peak_flops(dt),
        extra={"compute_fwd": mb * compute_fwd, "compute_bwd": mb * compute_bwd, "attention": mb * 3 * L * att,
               "elementwise": mb * elementwise, "scores_fwd": mb * L * ew_fwd_scores,
               "dp_buckets": np.where(g.gd > 1, n_buckets, 0)},
    )
