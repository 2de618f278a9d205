"""The runtime side of ``perfmodel`` calibration and validation: measurements on real ranks.

``perfmodel`` (pure numpy/scipy) fits and ranks; this module measures, through the runtime:

- :func:`measure`: every collective the grid can post (all-reduce, all-gather, reduce-scatter over each
  (group size, stride) a grid of ``nranks`` ranks can have) and torch GEMMs of given shapes, all run on
  real gloo ranks at once (every group of a dimension busy together, every rank computing together, as in
  training). Returns plain dicts in ``perfmodel.calibrate``'s sample formats (axgrid does not import perfmodel).
- :func:`time_configs` / :func:`time_steps`: run a transformer on given grids for a few steps and return
  seconds per step (mean over the timed steps after warm-up; best of ``rounds`` interleaved rounds).

The timed workload is ``axgrid.models.gpt.GPT`` when that module exists, else :class:`TimingTransformer`,
a transformer-shaped stack of :class:`axgrid.nn.Linear` layers in the sharded layout; :func:`workload_name`
says which. Measurements use one thread per rank (``torch.set_num_threads(1)``).

Samples (dicts):
  comm: {"op", "group_size", "stride", "bytes" (ledger bytes: AR tensor / AG output / RS input),
         "seconds" (median over reps of the slowest rank's time), "concurrent": 1}
  gemm: {"m", "n", "k", "seconds" ([m,k]·[k,n], mean over ranks of the per-call time in a window where
         every rank runs it), "dtype"}
"""
from __future__ import annotations

import importlib.util
import math
import statistics
import time
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

OPS = ("all_reduce", "all_gather", "reduce_scatter")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: Overlap switches passed to the runtime (``axgrid.OverlapConfig``); "keep" = keep_gathered_weights.
OVERLAPS = ("oar", "ors", "oag", "odp", "keep")


# ------------------------------------------------------------------------------------------ helpers


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def group_layouts(nranks: int) -> list[tuple[int, int, str, str]]:
    """Every (group size p > 1, stride s) a grid of ``nranks`` ranks in the default order can have, each with a
    grid spec and the dimension whose groups have that size and stride: (p, s, spec, dim).

    Stride 1 comes from x groups (``p x 1 x 1 x n/p``), stride s > 1 from y groups (``s x p x 1 x n/(s·p)``)."""
    if not isinstance(nranks, int) or nranks < 2:
        raise ValueError(f"nranks must be an integer >= 2 to measure collectives, got {nranks!r}")
    out = []
    for s in _divisors(nranks):
        for p in _divisors(nranks // s):
            if p < 2:
                continue
            if s == 1:
                out.append((p, 1, f"{p}x1x1x{nranks // p}", "x"))
            else:
                out.append((p, s, f"{s}x{p}x1x{nranks // (s * p)}", "y"))
    return out


def _elems_for(op: str, nbytes: int, p: int, elem: int) -> tuple[int, int]:
    """(elements of the tensor passed in, elements of the ledger's buffer) for a buffer of about ``nbytes``."""
    total = max(p, (nbytes // elem) // p * p)
    return (total // p, total) if op == "all_gather" else (total, total)


def _rank_collectives(spec: str, dim: str, ops: Sequence[str], sizes_bytes: Sequence[int], reps: int,
                      warmup: int, timeout_s: float) -> dict[tuple[str, int], list[float]]:
    """On one rank: seconds per rep for every (op, ledger bytes), through ``grid.comm`` with timing on."""
    import axgrid
    torch.set_num_threads(1)
    cfg = axgrid.RuntimeConfig(timeout_s=timeout_s, record_timing=True)
    grid = axgrid.init(spec, config=cfg)
    try:
        p = grid.size(dim)
        out: dict[tuple[str, int], list[float]] = {}
        for op in ops:                     # first use of a group sets up its connections: not timed
            getattr(grid.comm, op)(torch.zeros(p), dim)
        for op in ops:
            for nb in sizes_bytes:
                n_in, _ = _elems_for(op, nb, p, 4)
                t = torch.randn(n_in)
                fn = getattr(grid.comm, op)
                times = []
                for i in range(warmup + reps):
                    x = t.clone() if op == "all_reduce" else t
                    dist.barrier()
                    grid.ledger.reset()
                    fn(x, dim)
                    e = grid.ledger.entries[(dim, op)]
                    if i >= warmup:
                        times.append(e.seconds)
                out[(op, e.bytes)] = times
        return out
    finally:
        grid.destroy()


def _rank_gemms(shapes: Sequence[tuple[int, int, int]], dtype: str, min_time_s: float) -> list[float]:
    """On one rank: seconds per ``A[m,k] @ B[k,n]`` for each shape, as the throughput of a window of at least
    ``min_time_s`` during which every rank runs the same GEMM (they start together after a barrier). With more
    ranks than cores this is each rank's fair share, preemption included, as in a training step; timing single
    calls instead would catch the ones that ran undisturbed and overstate the rate."""
    torch.set_num_threads(1)
    dt = DTYPES[dtype]
    out = []
    for m, n, k in shapes:
        a, b = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
        a @ b                                     # warm-up (allocations, first-call costs)
        dist.barrier()
        count, t0 = 0, time.perf_counter()
        while True:
            a @ b
            count += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_time_s and count >= 2:
                break
        out.append(elapsed / count)
    return out


def measure(nranks: int, sizes_bytes: Sequence[int], gemm_shapes: Sequence[tuple[int, int, int]], *,
            reps: int = 5, warmup: int = 2, ops: Sequence[str] = OPS, gemm_dtype: str = "fp32",
            gemm_min_time_s: float = 0.05, timeout_s: float = 120.0, pool: Any = None
            ) -> tuple[list[dict], list[dict]]:
    """Measure collectives and GEMMs on ``nranks`` real gloo ranks; returns (comm samples, gemm samples).

    Collectives: every (group size, stride) of :func:`group_layouts`, each op in ``ops``, each size in
    ``sizes_bytes`` (fp32 buffers of about that many bytes, rounded to a multiple of the group size); per rep
    all ranks start together (barrier) and the slowest rank's time counts; the sample is the median over
    ``reps``. GEMMs: each (m, n, k) in ``gemm_shapes`` on every rank at once, one thread per rank, timed as the
    throughput of a window of ``gemm_min_time_s`` (every rank busy: its fair share of the cores).
    ``pool``: an ``axgrid.testing.RankPool(nranks)`` to reuse (default: one is started and closed)."""
    from .testing import RankPool
    layouts = group_layouts(nranks)
    bad_ops = [o for o in ops if o not in OPS]
    if bad_ops:
        raise ValueError(f"unknown collective(s) {bad_ops}; choose from {', '.join(OPS)}")
    if not sizes_bytes or any(not isinstance(s, int) or s < 4 for s in sizes_bytes):
        raise ValueError(f"sizes_bytes must be a non-empty list of integers >= 4, got {list(sizes_bytes)!r}")
    for shp in gemm_shapes:
        if len(shp) != 3 or any(not isinstance(v, int) or v < 1 for v in shp):
            raise ValueError(f"GEMM shape {shp!r} must be three positive integers (m, n, k)")
    if gemm_dtype not in DTYPES:
        raise ValueError(f"unknown dtype {gemm_dtype!r}; choose from {', '.join(DTYPES)}")
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    own = pool is None
    pool = pool or RankPool(nranks, timeout_s=timeout_s)
    if pool.world_size != nranks:
        raise ValueError(f"pool has {pool.world_size} ranks, nranks is {nranks}")
    deadline = 60.0 + 4 * timeout_s
    comm: list[dict] = []
    gemm: list[dict] = []
    try:
        for p, s, spec, dim in layouts:
            per_rank = pool.run(_rank_collectives, spec, dim, list(ops), list(sizes_bytes), reps, warmup,
                                timeout_s, deadline_s=deadline)
            for key in per_rank[0]:
                slowest = [max(r[key][i] for r in per_rank) for i in range(reps)]
                comm.append({"op": key[0], "group_size": p, "stride": s, "bytes": int(key[1]),
                             "seconds": float(statistics.median(slowest)), "concurrent": 1})
        shapes = [tuple(int(v) for v in shp) for shp in gemm_shapes]
        if shapes:
            per_rank = pool.run(_rank_gemms, shapes, gemm_dtype, gemm_min_time_s, deadline_s=deadline)
            for i, (m, n, k) in enumerate(shapes):
                gemm.append({"m": m, "n": n, "k": k, "seconds": float(statistics.mean(r[i] for r in per_rank)),
                             "dtype": gemm_dtype})
    finally:
        if own:
            pool.close()
    return comm, gemm


# ------------------------------------------------------------------------------------------ step timing


def _has_gpt() -> bool:
    return importlib.util.find_spec("axgrid.models.gpt") is not None


WORKLOADS = ("auto", "gpt", "stack")


def _use_gpt(workload: str) -> bool:
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    if workload == "gpt" and not _has_gpt():
        raise ValueError("workload 'gpt' asked for, but axgrid.models.gpt does not exist")
    return workload == "gpt" or (workload == "auto" and _has_gpt())


def workload_name(workload: str = "auto") -> str:
    """Which model :func:`time_configs` trains: "auto" = the GPT when ``axgrid.models.gpt`` exists, else the
    stack."""
    if _use_gpt(workload):
        return "axgrid.models.gpt.GPT (embeddings, layer norms, vocab-parallel cross entropy)"
    return ("axgrid.calibration.TimingTransformer (4 axgrid.nn.Linear per block in the sharded layout + "
            "local causal attention + LM head; no embedding, no layer norm)")


def _spec_dict(model: Any) -> dict[str, Any]:
    """Sizes of a transformer given as a perfmodel ``TransformerSpec`` (or anything with those attributes) or a
    dict with layers, hidden, heads, seq, vocab (bias optional)."""
    get = model.get if isinstance(model, dict) else (lambda k, d=None: getattr(model, k, d))
    out = {k: get(k) for k in ("layers", "hidden", "heads", "seq", "vocab")}
    missing = [k for k, v in out.items() if not isinstance(v, int) or v <= 0]
    if missing:
        raise ValueError(f"model needs positive integer {', '.join(missing)} (got {out})")
    out["bias"] = bool(get("bias", True))
    return out


class TimingTransformer(nn.Module):
    """A transformer-shaped stack for timing: per block QKV (3h×h, normal), local causal attention on this rank's
    heads, attention-out (h×h, transposed), residual, MLP-up (4h×h, normal), GELU, MLP-down (h×4h, transposed),
    residual; then the LM head (V×h, normal, no bias, V padded up to a multiple of Gy). Everything runs in the
    layer layout (input ``[m', h/Gx]``: tokens over (d, z), features over x), so the only collectives are the
    layers' own (DESIGN.md). Attention runs within sequences of ``gcd(m', seq)`` local tokens (the full
    sequence when z does not split sequences). Not a faithful GPT (the QKV split ignores head boundaries of
    the block, no layer norm or embedding): it reproduces the GEMM shapes and collectives, which is what is
    timed."""

    def __init__(self, spec: dict[str, Any], grid: Any, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        from .nn import Linear
        h, heads, bias = spec["hidden"], spec["heads"], spec["bias"]
        gy = grid.size("y")
        if heads % gy:
            raise ValueError(f"heads {heads} are not divisible by Gy={gy} (attention runs on local heads)")
        self.grid, self.seq, self.hidden = grid, spec["seq"], h
        self.heads_loc, self.head_dim = heads // gy, h // heads
        kw = dict(grid=grid, input_layout="sharded", output_layout="sharded", dtype=dtype)
        self.blocks = nn.ModuleList()
        for _ in range(spec["layers"]):
            self.blocks.append(nn.ModuleDict({
                "qkv": Linear(h, 3 * h, bias, transpose=False, **kw),
                "attn_out": Linear(h, h, bias, transpose=True, **kw),
                "mlp_up": Linear(h, 4 * h, bias, transpose=False, **kw),
                "mlp_down": Linear(4 * h, h, bias, transpose=True, **kw)}))
        vocab = -(-spec["vocab"] // gy) * gy
        self.head = Linear(h, vocab, False, transpose=False, **kw)
        self.act = nn.GELU()

    def _attention(self, qkv: torch.Tensor) -> torch.Tensor:
        m = qkv.shape[0]
        s = math.gcd(m, self.seq)
        q, k, v = (t.reshape(m // s, s, self.heads_loc, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, -1))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(m, self.heads_loc * self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[m', h/Gx]`` -> a scalar loss (mean square of the head's local logits: no extra collective)."""
        for b in self.blocks:
            x = x + b["attn_out"](self._attention(b["qkv"](x)))
            x = x + b["mlp_down"](self.act(b["mlp_up"](x)))
        return self.head(x).float().pow(2).mean()


def _check_options(overlap: str, recompute: bool, workload: str = "auto") -> Any:
    """The runtime's OverlapConfig for ``overlap`` ("oar,ors,oag,odp,keep"-style, "all", "none"): every switch
    is passed to the runtime as given. Activation recompute is the GPT's (``GPTConfig.recompute``); the stack
    workload has none, so recompute is refused there."""
    from .config import OverlapConfig
    names = {s.strip() for s in overlap.lower().split(",") if s.strip()} - {"none", "off"}
    if "all" in names:
        names = (names - {"all"}) | {"oar", "ors", "oag", "odp"}
    unknown = sorted(names - set(OVERLAPS))
    if unknown:
        raise ValueError(f"unknown overlap switch(es) {unknown}; choose from {', '.join(OVERLAPS)}, all, none")
    if recompute and not _use_gpt(workload):
        raise ValueError("activation recompute is not implemented by the timed workload; predict without it "
                         "(python -m axgrid.perfmodel validate ... --no-recompute)")
    return OverlapConfig.parse(",".join(sorted(names)) or "none")


def _rank_time_steps(spec: dict[str, Any], grid_spec: str, batch: int, dtype: str, microbatches: int,
                     overlap: str, recompute: bool, steps: int, warmup: int, timeout_s: float,
                     workload: str = "auto", bucket_bytes: Optional[int] = None) -> float:
    """On one rank: build the grid and the model, train ``warmup + steps`` steps, return mean s/step timed.

    Each step: every micro-batch's forward and backward (all but the last under ``grid.no_sync()``, so with ODP
    the data-parallel buckets are all-reduced once per step, during the last backward), then
    ``axgrid.sync_gradients`` (completes what is in flight; without ODP it posts the buckets) and the optimizer."""
    import contextlib

    import axgrid
    torch.set_num_threads(1)
    ov = _check_options(overlap, recompute, workload)
    kw = {} if bucket_bytes is None else {"bucket_bytes": int(bucket_bytes)}
    grid = axgrid.init(grid_spec, config=axgrid.RuntimeConfig(timeout_s=timeout_s, overlap=ov, seed=0, **kw))
    try:
        gx, gz, gd = grid.size("x"), grid.size("z"), grid.size("d")
        tokens = batch // microbatches * spec["seq"]
        if (batch % microbatches) or tokens % (gd * gz):
            raise ValueError(f"batch {batch} / {microbatches} micro-batches × seq {spec['seq']} does not split "
                             f"over Gd·Gz={gd * gz}")
        m_loc = tokens // (gd * gz)
        dt = DTYPES[dtype]
        if _use_gpt(workload):
            model, make_input = _gpt_workload(spec, grid, dt, batch // microbatches // gd, microbatches, recompute)
        else:
            model = TimingTransformer(spec, grid, dt)
            gen = torch.Generator().manual_seed(grid.rank)
            inputs = [torch.randn(m_loc, spec["hidden"] // gx, generator=gen, dtype=dt) for _ in range(microbatches)]
            make_input = inputs.__getitem__
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            for i in range(microbatches):
                with grid.no_sync() if i < microbatches - 1 else contextlib.nullcontext():
                    model(make_input(i)).backward()
            axgrid.sync_gradients(model, grid)
            opt.step()

        for _ in range(warmup):
            step()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        dist.barrier()
        return (time.perf_counter() - t0) / steps
    finally:
        grid.destroy()


def _gpt_workload(spec: dict[str, Any], grid: Any, dtype: torch.dtype, batch_d: int, microbatches: int,
                  recompute: bool):
    """``axgrid.models.gpt.GPT`` with this spec, as a module ``ids -> loss``, and micro-batch i's input: this
    data-parallel rank's ``batch_d`` sequences of ``seq + 1`` random token ids (the same on its x·y·z block)."""
    from .models.gpt import GPT, GPTConfig
    gz = grid.size("z")
    if batch_d % gz:
        raise ValueError(f"GPT: {batch_d} sequences per data-parallel rank per micro-batch are not divisible by "
                         f"Gz={gz} (z splits whole sequences)")
    cfg = GPTConfig(layers=spec["layers"], hidden=spec["hidden"], heads=spec["heads"], seq=spec["seq"],
                    vocab=spec["vocab"], bias=spec["bias"], recompute=recompute)
    model = _GPTLoss(GPT(cfg, grid), autocast_dtype=None if dtype == torch.float32 else dtype)
    grid.watch(model)                     # ODP covers every parameter, as in train_gpt
    gen = torch.Generator().manual_seed(1000 + grid.index("d"))
    ids = [torch.randint(0, spec["vocab"], (batch_d, spec["seq"] + 1), generator=gen) for _ in range(microbatches)]
    return model, ids.__getitem__


class _GPTLoss(nn.Module):
    """``ids [B, S+1] -> loss`` of next-token prediction; low precision runs as train_gpt runs it: fp32 parameters
    under autocast (casting the whole model would leave the fp32 embedding sums meeting bf16 weights)."""

    def __init__(self, gpt: nn.Module, autocast_dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.gpt = gpt
        self.autocast_dtype = autocast_dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        device_type = next(self.gpt.parameters()).device.type
        with torch.autocast(device_type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            return self.gpt(ids[:, :-1], targets=ids[:, 1:])


def time_configs(model: Any, grids: Sequence[tuple[int, int, int, int]], batch: int, dtype: str = "fp32",
                 microbatches: Sequence[int] | int = 1, overlap: str = "none", recompute: bool = False,
                 steps: int = 3, warmup: int = 1, rounds: int = 2, timeout_s: float = 120.0,
                 progress: Optional[Any] = None, workload: str = "auto",
                 bucket_bytes: Optional[int] = None) -> list[float]:
    """Seconds per training step of ``model`` (a transformer description: see :func:`_spec_dict`) on each grid
    (all grids must have the same number of ranks), global ``batch`` sequences per step in ``microbatches``
    micro-batches (one value or one per grid), the runtime's ``overlap`` switches (``"oar,ors,oag,odp,keep"``,
    ``"all"`` or ``"none"``: passed to ``axgrid.RuntimeConfig(overlap=...)``), activation ``recompute`` (the GPT's
    ``GPTConfig.recompute``) and data-parallel ``bucket_bytes`` (None: the runtime's default).

    Each configuration runs ``warmup`` untimed steps then ``steps`` timed steps; configurations are run in
    ``rounds`` interleaved passes and the fastest pass counts (the host is shared: the minimum is the least
    disturbed estimate). ``progress(i, grid, seconds)`` is called after each measurement when given.
    ``workload``: "auto" (the GPT if it exists, else :class:`TimingTransformer`), "gpt" or "stack"."""
    from .testing import RankPool
    spec = _spec_dict(model)
    grids = [tuple(int(v) for v in g) for g in grids]
    if not grids:
        raise ValueError("no grid to time")
    sizes = {math.prod(g) for g in grids}
    if len(sizes) != 1:
        raise ValueError(f"all grids must have the same number of ranks, got {sorted(sizes)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    mbs = [int(microbatches)] * len(grids) if isinstance(microbatches, int) else [int(v) for v in microbatches]
    if len(mbs) != len(grids) or min(mbs) < 1:
        raise ValueError(f"microbatches must be one positive int or one per grid, got {microbatches!r}")
    if steps < 1 or warmup < 0 or rounds < 1:
        raise ValueError(f"need steps >= 1, warmup >= 0, rounds >= 1 (got {steps}, {warmup}, {rounds})")
    _use_gpt(workload)
    _check_options(overlap, recompute, workload)   # fail here, before any rank starts
    if bucket_bytes is not None and (not isinstance(bucket_bytes, int) or bucket_bytes <= 0):
        raise ValueError(f"bucket_bytes must be a positive int, got {bucket_bytes!r}")
    n = sizes.pop()
    best = [math.inf] * len(grids)
    with RankPool(n, timeout_s=timeout_s) as pool:
        for _ in range(rounds):
            for i, g in enumerate(grids):
                per_rank = pool.run(_rank_time_steps, spec, "x".join(map(str, g)), batch, dtype, mbs[i], overlap,
                                    recompute, steps, warmup, timeout_s, workload, bucket_bytes,
                                    deadline_s=60.0 + 10 * timeout_s)
                best[i] = min(best[i], max(per_rank))
                if progress is not None:
                    progress(i, g, max(per_rank))
    return best


def time_steps(model: Any, grid: tuple[int, int, int, int], batch: int, dtype: str = "fp32",
               microbatches: int = 1, overlap: str = "none", recompute: bool = False, steps: int = 3,
               **kw: Any) -> float:
    """Seconds per step of one configuration (see :func:`time_configs`)."""
    return time_configs(model, [grid], batch, dtype, microbatches, overlap, recompute, steps, **kw)[0]
