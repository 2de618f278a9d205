"""What a dry run runs, and what perfmodel predicts for it. Torch-free: a configuration is checked (and bad input
refused in one line naming the valid choices) before anything is allocated.

:func:`resolve` turns the command line's choices into a :class:`DryRunConfig` -- the grid defaults to perfmodel's
best for the model, GPU count, machine and batch, and the micro-batch count to the fewest that fit there;
:func:`predict` gives perfmodel's figures for the same configuration (:class:`Prediction`): memory by the dry run's
categories (:data:`CATEGORIES`) and the bytes and calls of every collective per (grid dimension,
operation), for a GPU (``perfmodel.memory.GPU``: fused attention, collectives in the tensors' dtype).

The model is an ``axgrid.spec.TransformerShape``: a named GPT size or a Hugging Face ``config.json`` of a
Llama-structured family (``TransformerShape.from_config_json``): for the latter the grid must be given (perfmodel ranks GPT grids only), and
perfmodel predicts the collectives and the parameter, gradient and optimizer bytes; the categories it does not model
for that family are ``None`` in the :class:`Prediction`, named in its ``not_modelled``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

from axgrid import perfmodel as pm
from axgrid.perfmodel.cli import parse_grid
from axgrid.perfmodel.comm import used_flag_bytes
from axgrid.perfmodel.memory import static_bytes
from axgrid.perfmodel.step import step_collective_events, step_gradient_sizes
from axgrid.perfmodel.lora import lora_plan
from axgrid.perfmodel.memory import GPU, memory_per_gpu
from axgrid.perfmodel.moe import ep_reasons, with_expert_memory
from axgrid.perfmodel.space import Grids, describe, divisibility, enumerate_grids
from axgrid.perfmodel.problem import DTYPE_BYTES
from axgrid.spec import (CONFIG_SEQ, DEFAULT_BUCKET_BYTES, PUBLIC_MODELS, GridShape, OverlapConfig, TransformerShape,
                         is_config_path)


class DryRunError(ValueError):
    """A configuration that cannot run: the message names the value and what would work."""


def parse_overlap(spec: str) -> OverlapConfig:
    """``--overlap`` as the runtime reads it (``axgrid.OverlapConfig.parse``); a bad one raises :class:`DryRunError`."""
    try:
        return OverlapConfig.parse(spec)
    except ValueError as e:
        raise DryRunError(f"--overlap {spec!r}: {e}") from None


@dataclass(frozen=True)
class DryRunConfig:
    """One dry run: ``model`` (the shape perfmodel prices; the runtime builds the same GPT, or from a Hugging Face
    decoder's shape the model of its config.json), ``grid`` ("GxxGyxGzxGd"),
    ``batch`` sequences per step in ``microbatches`` micro-batches, ``dtype`` ("bf16": autocast with fp32
    weights; "fp32"), ``recompute``, ``overlap`` (the runtime's ``--overlap``), the ``machine`` perfmodel prices."""

    model: TransformerShape
    grid: str
    batch: int
    microbatches: int
    dtype: str = "bf16"
    recompute: bool = True
    overlap: str = "all"
    machine: str = "frontier"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    zero: int = 0
    lora_r: int = 0                        # LoRA adapters of this rank (0: full training); axgrid.lora's alpha 2r
    lora_targets: tuple[str, ...] = ()     # their target layers (empty: every block FC layer, perfmodel's default)
    cp: int = 1                            # context parallelism: each sequence split over cp z-ranks (group "c")
    cp_exchange: str = "all_gather"        # how attention exchanges keys and values under it ("all_gather", "ring")
    ep: int = 1                            # expert parallelism: a mixture of experts' experts over ep d-ranks ("e")

    @property
    def lora_layers(self) -> tuple[str, ...]:
        """The LoRA target names as ``axgrid.lora`` takes them (``perfmodel.lora.lora_targets``' default when none
        were given); () without LoRA."""
        from axgrid.perfmodel.lora import lora_targets
        return lora_targets(self.model, self.lora_targets or None) if self.lora_r else ()

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return GridShape.parse(self.grid).as_tuple()

    @property
    def gpus(self) -> int:
        gx, gy, gz, gd = self.shape
        return gx * gy * gz * gd

    @property
    def sequences_per_microbatch(self) -> int:
        """Sequences of one micro-batch over the whole grid."""
        return self.batch // self.microbatches

    @property
    def tokens_per_gpu(self) -> int:
        """m': tokens per GPU per micro-batch."""
        _, _, gz, gd = self.shape
        return self.sequences_per_microbatch * self.model.seq // (gz * gd)      # the same under context parallelism

    def options(self) -> pm.Options:
        """perfmodel's options for this run."""
        ov = parse_overlap(self.overlap)
        return pm.Options(overlap_ar=ov.oar, overlap_rs=ov.ors, overlap_ag=ov.oag, overlap_dp=ov.odp,
                          keep_gathered=ov.keep_gathered_weights, recompute=self.recompute,
                          microbatches=self.microbatches, bucket_bytes=self.bucket_bytes, zero=self.zero,
                          lora_r=self.lora_r, lora_targets=self.lora_layers or None, cp=self.cp,
                          cp_exchange=self.cp_exchange)

    def problem(self) -> pm.Problem:
        return pm.Problem(self.model, self.batch, self.gpus, self.dtype, self.options())

    def gpt_config(self):
        """The runtime's ``GPTConfig`` of the same model (imports torch)."""
        from axgrid.models.gpt import GPTConfig
        return GPTConfig(self.model, recompute=self.recompute, cp_exchange=self.cp_exchange)

    @property
    def hf(self) -> bool:
        """Whether the model is a Hugging Face config's (a Llama-structured decoder's shape, not the GPT's)."""
        return not self.model.is_gpt

    def as_json(self) -> dict:
        m = self.model
        hf = {"config": m.path, "family": m.family, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
              "intermediate": m.ffn, "tied": m.tied} if self.hf else {}
        return {"model": m.name, **hf, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "seq": m.seq,
                "vocab": m.vocab, "gpus": self.gpus, "grid": self.grid, "machine": self.machine, "batch": self.batch,
                "microbatches": self.microbatches, "dtype": self.dtype, "recompute": self.recompute,
                "overlap": self.overlap, "bucket_bytes": self.bucket_bytes, "zero": self.zero,
                "lora_r": self.lora_r, "lora_targets": list(self.lora_layers), "cp": self.cp,
                "cp_exchange": self.cp_exchange, "ep": self.ep}


#: the memory categories of a rank's step, measured (:mod:`axgrid.dryrun.step`) and predicted
CATEGORIES = ("parameters", "gradients", "optimizer", "buckets", "gathered", "activations", "temporaries")


def bytes_by_dim(comm: dict[tuple[str, str], tuple[int, int]]) -> dict[str, int]:
    """Bytes per grid dimension of ``comm``, {(dim, op): (calls, bytes)}."""
    out: dict[str, int] = {}
    for (dim, _), (_, nbytes) in comm.items():
        out[dim] = out.get(dim, 0) + nbytes
    return out


@dataclass(frozen=True)
class Prediction:
    """perfmodel's figures for one rank of a :class:`DryRunConfig` (bytes); ``None`` where perfmodel does not
    model a figure for the model's family, and ``not_modelled`` says which and why ("" when it models all)."""

    peak: Optional[int]
    memory: dict[str, Optional[int]]
    comm: dict[tuple[str, str], tuple[int, int]]     # (dim, op) -> (calls, bytes)
    not_modelled: str = ""
    step: str = ""        # perfmodel's time per batch on the machine, with its error band, as one phrase
    #: zero 0's used-flags (``GradBuckets._post_used_flags``: one int32 per trained parameter, in flight over d
    #: behind the last bucket; the buckets' category holds them while they are): at most this many bytes
    used_flags: int = 0


def step_time(cfg: "DryRunConfig") -> str:
    """perfmodel's predicted seconds per batch of ``cfg`` on its machine (``perfmodel.price_grid``) with the
    machine's error band, as a phrase for the table."""
    if cfg.hf and cfg.lora_r:
        return "s/batch not modelled for LoRA on a Hugging Face decoder (perfmodel prices LoRA on the GPT)"
    machine = pm.load_machine(cfg.machine)
    row = pm.price_grid(cfg.problem(), machine, cfg.shape, cfg.ep)
    if not row.feasible:
        return f"not priced on {machine.name}: {row.reason}"
    band = f"band {row.time_low:.3g}–{row.time_high:.3g} s" if row.time_high > row.time_low else "no band held"
    return f"{row.time_s:.3f} s/batch on {machine.name} ({band})"


def predict(cfg: DryRunConfig) -> Prediction:
    """perfmodel's memory (``perfmodel.memory.memory_per_gpu``, on a GPU) and collectives (the replay of the whole
    step, ``perfmodel.step``, for the GPT and a Hugging Face config alike) for ``cfg``."""
    gx, gy, gz, gd = cfg.shape
    b = DTYPE_BYTES[cfg.dtype]
    opt = cfg.options()
    if cfg.hf and cfg.lora_r:
        return _predict_decoder(cfg)
    mem = memory_per_gpu(cfg.model, gx, gy, gz, gd, cfg.tokens_per_gpu, b, cfg.dtype == "fp32", opt, device=GPU)
    mem = with_expert_memory(mem, cfg.model, gx, gy, gz, gd, cfg.ep, cfg.tokens_per_gpu, b, opt)
    memory = {"parameters": mem.params, "gradients": mem.grads, "optimizer": mem.optimizer,
              "buckets": mem.dp_buckets, "gathered": mem.gathered, "activations": mem.activations}
    memory = {k: int(round(float(v))) for k, v in memory.items()}
    peak = int(round(float(mem.total)))
    memory["temporaries"] = peak - sum(memory.values())
    args = (cfg.model, cfg.shape, cfg.sequences_per_microbatch * cfg.model.seq, cfg.microbatches, b)
    kw = dict(keep_gathered=opt.keep_gathered, recompute=opt.recompute, grad_dtype_bytes=opt.grad_bytes,
              bucket_bytes=opt.bucket_bytes, zero=cfg.zero, clip=opt.clip,      # the step clips (step.py)
              lora=lora_plan(cfg.model, opt), cp=cfg.cp, cp_exchange=cfg.cp_exchange, ep=cfg.ep)
    comm = _count(step_collective_events(*args, **kw))
    trained = step_gradient_sizes(cfg.model, cfg.shape, b, kw["lora"])
    flags = used_flag_bytes(trained) if cfg.zero == 0 and gd > 1 else 0
    return Prediction(peak, memory, comm, step=step_time(cfg), used_flags=flags)


def _count(events: list[tuple[str, str, int]]) -> dict[tuple[str, str], tuple[int, int]]:
    """(dim, op) -> (calls, bytes) of a replay's ``events``."""
    comm: dict[tuple[str, str], tuple[int, int]] = {}
    for dim, op, nb in events:
        calls, total = comm.get((dim, op), (0, 0))
        comm[(dim, op)] = (calls + 1, total + nb)
    return comm


def _predict_decoder(cfg: DryRunConfig) -> Prediction:
    """perfmodel's figures for LoRA on a Hugging Face decoder (:mod:`axgrid.perfmodel.step`): every collective
    (the clipping's included), and the parameter, gradient and optimizer bytes (the buckets: nothing with zero 0 or
    Gd = 1; with zero >= 1 not modelled, though with zero 1 the report still bounds them by the gradients, as for
    the GPT); the adapters' activations are priced for the GPT block only, so the rest is named as not
    modelled."""
    m, opt = cfg.model, cfg.options()
    lora = lora_plan(m, opt)
    comm = _count(step_collective_events(m, cfg.shape, cfg.sequences_per_microbatch * m.seq, cfg.microbatches,
                                         DTYPE_BYTES[cfg.dtype], opt.keep_gathered, opt.recompute,
                                         opt.grad_bytes, opt.bucket_bytes, cfg.zero, clip=opt.clip, lora=lora))
    params, grads, optimizer = static_bytes(m, cfg.shape, cfg.zero, cfg.bucket_bytes, lora)
    memory: dict[str, Optional[int]] = {"parameters": params, "gradients": grads, "optimizer": optimizer,
                                        "buckets": 0 if cfg.zero == 0 or cfg.shape[3] == 1 else None}
    unknown = ["activations", "gathered", "temporaries"] + ([] if memory["buckets"] is not None else ["buckets"])
    memory.update({c: None for c in unknown})
    trained = step_gradient_sizes(m, cfg.shape, opt.grad_bytes, lora)      # the adapters: their used-flags
    flags = used_flag_bytes(trained) if cfg.zero == 0 and cfg.shape[3] > 1 else 0
    return Prediction(None, memory, comm, f"{', '.join(unknown)} and the peak: not modelled by perfmodel for LoRA "
                                          f"on {m.family} (its adapters' formulas are the GPT block's)",
                      step=step_time(cfg), used_flags=flags)


# ------------------------------------------------------------------------------------------------ choosing

def valid_grids(model: TransformerShape, gpus: int, batch: int, microbatches: Optional[int]) -> list[str]:
    """Every grid of ``gpus`` ranks that the model and batch divide (perfmodel's divisibility rules)."""
    g = enumerate_grids(gpus)
    bad = divisibility(model, batch, g, microbatches)
    ok = ~sum(bad.values()).astype(bool) if bad else None
    return ["x".join(map(str, t)) for t, good in zip(g.tuples(), ok) if good]


def _grid_problems(model: TransformerShape, shape: tuple[int, int, int, int], batch: int,
                   microbatches: Optional[int], cp: int = 1) -> list[str]:
    bad = divisibility(model, batch, Grids.of([shape]), microbatches, cp)
    if cp > 1 and shape[2] % cp:
        return [f"cp={cp} does not divide Gz={shape[2]} (a sequence spans cp z-ranks); context-parallel sizes that "
                f"do: {[c for c in range(1, shape[2] + 1) if shape[2] % c == 0]}"]
    return [describe(k, model, batch, shape, microbatches) for k, v in bad.items() if v[0]]


def _read_grid(grid: str, gpus: Optional[int], fitting: Callable[[int], list[str]]) -> tuple[int, int, int, int]:
    """``--grid`` against ``--gpus`` as perfmodel reads them (:func:`axgrid.perfmodel.cli.parse_grid`, the rule of
    :meth:`GridShape.parse`); refused as a DryRunError that adds, where ``--gpus`` is given, the grids of that many
    ranks that ``fitting(gpus)`` lists."""
    try:
        return parse_grid(grid, gpus)
    except pm.PerfModelError as e:
        listed = f"; grids of {gpus} ranks that fit this model and batch: {_list(fitting(gpus))}" \
            if gpus is not None and gpus >= 1 else ""
        raise DryRunError(f"{e}{listed}") from None


def _list(grids: list[str], show: int = 12) -> str:
    if not grids:
        return "none"
    more = f" ... ({len(grids)} in all)" if len(grids) > show else ""
    return ", ".join(grids[:show]) + more


def _check_cp(spec: TransformerShape, cp: int, exchange: str) -> None:
    """``--cp`` and ``--cp-exchange`` against the model (``perfmodel.context_parallel.check``), as a DryRunError."""
    from axgrid.perfmodel.context_parallel import check
    try:
        check(spec, cp, exchange)
    except pm.PerfModelError as e:
        raise DryRunError(f"--cp {cp}: {e}") from None


def _check_options(dtype: str, overlap: str, zero: Optional[int], batch: Optional[int]) -> None:
    """The options a named size and a config.json share, each refused in one line naming the value and the fix."""
    if dtype not in ("bf16", "fp32"):
        raise DryRunError(f"--dtype {dtype!r}: choose bf16 (autocast, fp32 weights) or fp32")
    parse_overlap(overlap)
    if zero not in (None, 0, 1, 2):
        raise DryRunError(f"--zero {zero}: choose 0 (no sharding), 1 (optimizer state over d) or 2 (and gradients)")
    if batch is None or batch < 1:
        raise DryRunError(f"--batch {batch}: give the global batch in sequences (a positive integer)")


def resolve(model: str | TransformerShape, gpus: Optional[int], batch: int, *,
            grid: Optional[str] = None, machine: str = "frontier", dtype: str = "bf16", recompute: bool = True,
            overlap: str = "all", microbatches: Optional[int] = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
            zero: Optional[int] = None, seq: Optional[int] = None, lora_r: int = 0,
            lora_targets: Optional[tuple[str, ...]] = None, cp: int = 1,
            cp_exchange: str = "all_gather", ep: Optional[int] = None) -> DryRunConfig:
    """A checked :class:`DryRunConfig` (module docstring); ``zero=None``: the mode perfmodel picks for the grid (the
    fastest that fits). ``model``: a named size, a shape, or the path of a Hugging Face config.json (or its folder),
    trained on ``seq``-token sequences (default ``axgrid.spec.CONFIG_SEQ``). ``lora_r`` > 0: LoRA adapters of that rank on
    ``lora_targets`` (default: every FC layer of the block), the base frozen. Bad input raises
    :class:`DryRunError` naming the value and the valid choices (grids, micro-batch counts, layer names).
    ``cp``: context parallelism (``axgrid.init(..., cp=N)``: each sequence over ``cp`` z-ranks, so ``cp`` must divide
    Gz and cut the sequence into ``2·cp`` chunks), attention exchanging keys and values by ``cp_exchange``.
    ``ep``: a mixture of experts' expert-parallel size (``axgrid.init(..., ep=N)``: dividing Gd and the experts);
    None: perfmodel's for the grid it picks, 1 on a grid given."""
    if ep is not None and ep != 1 and lora_r:
        raise DryRunError(f"--ep {ep} with --lora-r {lora_r}: LoRA under expert parallelism is not priced; drop one")
    if cp != 1 and lora_r:
        raise DryRunError(f"--cp {cp} with --lora-r {lora_r}: LoRA under context parallelism is not priced; drop one")
    if isinstance(model, str) and not is_config_path(model) and model.lower() in PUBLIC_MODELS:
        model = PUBLIC_MODELS[model.lower()]
        if seq is not None:
            model = replace(model, seq=seq)
    if (isinstance(model, TransformerShape) and not model.is_gpt) or (isinstance(model, str) and is_config_path(model)):
        cfg = _resolve_decoder(model, gpus, batch, grid=grid, machine=machine, dtype=dtype, recompute=recompute,
                               overlap=overlap, microbatches=microbatches, bucket_bytes=bucket_bytes, zero=zero,
                               seq=seq, cp=cp, cp_exchange=cp_exchange, ep=ep)
        return _with_lora(cfg, lora_r, lora_targets)
    if lora_r:
        return _with_lora(resolve(model, gpus, batch, grid=grid, machine=machine, dtype=dtype, recompute=recompute,
                                  overlap=overlap, microbatches=microbatches, bucket_bytes=bucket_bytes, zero=zero,
                                  seq=seq, lora_r=0) if grid is not None else
                          _resolve_lora_grid(model, gpus, batch, machine, dtype, recompute, overlap, microbatches,
                                             bucket_bytes, zero, lora_r, lora_targets), lora_r, lora_targets)
    if ep not in (None, 1):
        raise DryRunError(f"--ep {ep}: {model if isinstance(model, str) else model.name} has no experts; give --ep 1 "
                          f"or a mixture of experts' config")
    if seq is not None:
        raise DryRunError(f"--seq {seq}: a named size has its own sequence length; --seq is for a config.json")
    try:
        spec = pm.get_model(model) if isinstance(model, str) else model
    except pm.PerfModelError as e:
        raise DryRunError(f"--model: {e}") from None
    _check_options(dtype, overlap, zero, batch)
    _check_cp(spec, cp, cp_exchange)
    if microbatches is not None and (microbatches < 1 or batch % microbatches):
        raise DryRunError(f"--microbatches {microbatches}: it must be positive and divide --batch {batch}")
    if grid is not None:
        shape = _read_grid(grid, gpus, lambda n: valid_grids(spec, n, batch, microbatches))
        gpus = shape[0] * shape[1] * shape[2] * shape[3]
        problems = _grid_problems(spec, shape, batch, microbatches, cp)
        if problems:
            raise DryRunError(f"--grid {grid} does not fit {spec.name} with batch {batch}: {'; '.join(problems)}; "
                              f"grids of {gpus} ranks that do: {_list(valid_grids(spec, gpus, batch, microbatches))}")
    if gpus is None or gpus < 1:
        raise DryRunError("give --gpus N (or a --grid)")
    try:
        mach = pm.load_machine(machine)
    except pm.PerfModelError as e:
        raise DryRunError(f"--machine: {e}") from None
    named = "x".join(map(str, shape)) if grid is not None else "1x1x1x1"     # a three-size grid: Gd from --gpus
    base = DryRunConfig(spec, named, batch, microbatches or 1, dtype, recompute, overlap, machine, bucket_bytes,
                        zero or 0, cp=cp, cp_exchange=cp_exchange)
    prob = replace(base.problem(), gpus=gpus, options=replace(base.options(), microbatches=microbatches, zero=zero))
    if grid is None:
        try:
            row = pm.rank(prob, mach, tp_pp_dp=False).feasible[0]
        except pm.NoFeasibleConfig as e:
            raise DryRunError(str(e)) from None
    else:
        row = pm.price_grid(prob, mach, shape)
    chosen = microbatches or int(row.microbatches)
    cfg = replace(base, grid=row.grid_str, microbatches=chosen, zero=row.zero if zero is None else zero)
    if zero and cfg.shape[3] == 1:
        raise DryRunError(f"--zero {zero} on grid {cfg.grid}: Gd = 1, nothing to shard over d; use --zero 0 or a grid "
                          f"with Gd > 1")
    gz, gd = cfg.shape[2], cfg.shape[3]
    groups = gz * gd // cp
    if cfg.sequences_per_microbatch % groups:
        fits = [m for m in range(1, batch + 1) if batch % m == 0 and (batch // m) % groups == 0]
        raise DryRunError(f"a micro-batch of {cfg.sequences_per_microbatch} sequences ({batch} in {chosen}) does not "
                          f"split over Gz·Gd/cp = {groups} (z splits whole sequences, cp z-ranks share one); "
                          f"micro-batch counts that do: {fits or 'none: raise --batch'}")
    return cfg


def _with_lora(cfg: DryRunConfig, lora_r: int, lora_targets: Optional[tuple[str, ...]]) -> DryRunConfig:
    """``cfg`` with LoRA of rank ``lora_r`` (0: none) on ``lora_targets``, checked (one line naming a bad value)."""
    if isinstance(lora_r, bool) or not isinstance(lora_r, int) or lora_r < 0:
        raise DryRunError(f"--lora-r {lora_r!r}: give the adapters' rank, a positive integer (0: full training)")
    if not lora_r:
        if lora_targets:
            raise DryRunError(f"--lora-targets {','.join(lora_targets)} without --lora-r: give the adapters' rank")
        return cfg
    from axgrid.perfmodel.lora import lora_targets as checked
    try:
        targets = checked(cfg.model, lora_targets)
    except pm.PerfModelError as e:
        raise DryRunError(f"--lora-targets: {e}") from None
    return replace(cfg, lora_r=lora_r, lora_targets=targets)


def _resolve_lora_grid(model, gpus, batch, machine, dtype, recompute, overlap, microbatches, bucket_bytes, zero,
                       lora_r, lora_targets) -> DryRunConfig:
    """:func:`resolve` of a named size with LoRA and no ``--grid``: perfmodel's best grid for the LoRA step."""
    try:
        spec = pm.get_model(model) if isinstance(model, str) else model
        mach = pm.load_machine(machine)
        from axgrid.perfmodel.lora import lora_targets as checked
        targets = checked(spec, lora_targets)
    except pm.PerfModelError as e:
        raise DryRunError(f"{e}") from None
    if gpus is None or gpus < 1:
        raise DryRunError("give --gpus N (or a --grid)")
    opt = pm.Options(microbatches=microbatches, zero=zero, bucket_bytes=bucket_bytes, recompute=recompute,
                     lora_r=lora_r, lora_targets=targets)
    try:
        row = pm.rank(pm.Problem(spec, batch, gpus, dtype, opt), mach, tp_pp_dp=False).feasible[0]
    except pm.NoFeasibleConfig as e:
        raise DryRunError(str(e)) from None
    return resolve(spec, gpus, batch, grid=row.grid_str, machine=machine, dtype=dtype, recompute=recompute,
                   overlap=overlap, microbatches=microbatches or int(row.microbatches), bucket_bytes=bucket_bytes,
                   zero=row.zero if zero is None else zero)




def _resolve_decoder(model: str | TransformerShape, gpus: Optional[int], batch: int, *, grid: Optional[str],
                     machine: str, dtype: str, recompute: bool, overlap: str, microbatches: Optional[int],
                     bucket_bytes: int, zero: Optional[int], seq: Optional[int], cp: int = 1,
                     cp_exchange: str = "all_gather", ep: Optional[int] = None) -> DryRunConfig:
    """:func:`resolve` for a Hugging Face config: the grid (default: perfmodel's best for ``gpus`` on the machine,
    with its micro-batches and zero mode) must divide the model (the plan's rules: hidden over Gx; the heads,
    key-value heads, intermediate size and vocabulary over Gy), the batch must split over Gz·Gd; with a grid given,
    micro-batches default to 1, zero to 0."""
    try:
        spec = model if isinstance(model, TransformerShape) else TransformerShape.from_config_json(model, seq or CONFIG_SEQ)
    except ValueError as e:
        raise DryRunError(f"--model {model}: {e}") from None
    _check_options(dtype, overlap, zero, batch)
    _check_cp(spec, cp, cp_exchange)
    if grid is None:
        if not gpus:
            raise DryRunError(f"--model {spec.path or spec.name}: give --gpus N (perfmodel picks the grid) or "
                              f"--grid GXxGYxGZxGD")
        try:
            mach = pm.load_machine(machine)
            prob = pm.Problem(spec, batch, gpus, dtype, pm.Options(recompute=recompute, zero=zero,
                                                                   microbatches=microbatches, cp=cp,
                                                                   cp_exchange=cp_exchange))
            feasible = [r for r in pm.rank(prob, mach, tp_pp_dp=False).feasible if ep is None or r.ep == ep]
            if not feasible:
                raise pm.NoFeasibleConfig(f"no grid of {gpus} GPUs with ep={ep} fits")
            row = feasible[0]
        except (pm.PerfModelError, pm.NoFeasibleConfig) as e:
            raise DryRunError(f"--model {spec.path or spec.name}: {e}") from None
        grid, microbatches, ep = "x".join(map(str, row.grid)), microbatches or int(row.microbatches), row.ep
        zero = row.zero if zero is None else zero
    microbatches = microbatches or 1
    if microbatches < 1 or batch % microbatches:
        raise DryRunError(f"--microbatches {microbatches}: it must be positive and divide --batch {batch}")
    shape = _read_grid(grid, gpus, lambda n: _decoder_grids(spec, n, batch // microbatches))
    n = shape[0] * shape[1] * shape[2] * shape[3]
    problems = spec.divisibility(shape)
    gz, gd = shape[2], shape[3]
    ep = 1 if ep is None else ep
    problems += ep_reasons(spec, gd, ep)
    if cp > 1 and gz % cp:
        problems.append(f"cp={cp} does not divide Gz={gz} (a sequence spans cp z-ranks)")
    elif (batch // microbatches) % (gz * gd // cp):
        problems.append(f"a micro-batch of {batch // microbatches} sequences not divisible by Gz*Gd/cp="
                        f"{gz * gd // cp} (z splits whole sequences{', cp z-ranks share one' if cp > 1 else ''})")
    if problems:
        raise DryRunError(f"--grid {grid} does not fit {spec.name}: {'; '.join(problems)}; grids of {n} ranks that "
                          f"do: {_list(_decoder_grids(spec, n, batch // microbatches))}")
    try:
        pm.load_machine(machine)
    except pm.PerfModelError as e:
        raise DryRunError(f"--machine: {e}") from None
    zero = zero or 0
    if zero and gd == 1:
        raise DryRunError(f"--zero {zero} on grid {grid}: Gd = 1, nothing to shard over d; use --zero 0 or a grid "
                          f"with Gd > 1")
    return DryRunConfig(spec, "x".join(map(str, shape)), batch, microbatches, dtype, recompute, overlap, machine,
                        bucket_bytes, zero, cp=cp, cp_exchange=cp_exchange, ep=ep)


def _decoder_grids(spec: TransformerShape, gpus: int, sequences: int) -> list[str]:
    """Grids of ``gpus`` ranks that ``spec`` divides and whose Gz·Gd splits a micro-batch of ``sequences``."""
    return ["x".join(map(str, t)) for t in enumerate_grids(gpus).tuples()
            if not spec.divisibility(t) and sequences % (t[2] * t[3]) == 0]


def role_ranks(cfg: DryRunConfig) -> list[int]:
    """Ranks that cover every distinct role of the grid. The GPT divides the grid (``GPTConfig.check_grid``), so
    every rank holds shards and posts collectives of the same shapes; what differs is where a z-split block's padding
    sits (on the last z rank), when a block does not split evenly over Gz. So: rank 0, and the last rank when some
    block pads."""
    from axgrid.perfmodel.comm import layer_volumes
    gx, gy, gz, _ = cfg.shape
    pads = any(int(v.padded) != int(v.block)
               for v in (layer_volumes(layer, gx, gy, gz, 1)
                         for layer in cfg.model.block_layers() + [cfg.model.head_layer()]))
    return [0, cfg.gpus - 1] if pads and cfg.gpus > 1 else [0]
