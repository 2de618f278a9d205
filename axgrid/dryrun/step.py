"""One rank's training step of a dry run: the real runtime (``axgrid.models.gpt.GPT``, or a Hugging Face model of a
config.json parallelized by its plan, ``axgrid.plans.causal_lm.causal_lm_from_config``; :func:`axgrid.train.train_step`:
forward, backward, gradient sync, clipping, AdamW) as rank ``r`` of a grid of any size, on the fakegpu device
(:mod:`.harness`: fake tensors, torch's fake process group), measured by :mod:`axgrid.metrics.memtrack` and the
grid's ledger.

What is measured, per rank (:class:`RankMeasure`), on the second step (the first makes AdamW's state and the
data-parallel buckets, as a training run's steps after its first have them):

- ``memory``: bytes by category. ``parameters``, ``gradients`` (with Gd > 1 they are views of the data-parallel
  buckets; with zero=2 also the gradients' shares), ``optimizer`` (AdamW's moments and 0-d steps, this d-rank's
  share with zero >= 1): the storages' bytes. ``buckets``: the peak of what the data-parallel buckets allocate in
  the backward (zero=2's full buckets; communication buffers). ``gathered``: the peak of what the runtime's weight
  source allocates (the weight blocks gathered over z). ``activations``: what the last micro-batch's forward saves
  for backward (each storage once; weight shards and kept gathered blocks left out). ``temporaries``: the rest of
  the peak (the peak minus all of the above).
- ``peak``: the step's peak of live tensor bytes, and ``moment``: where it happened (micro-batch, phase, module or
  autograd node, operator).
- ``comm``: the ledger, bytes and calls per (grid dimension, operation).
"""
from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ..metrics import memtrack as mt
from .config import DryRunConfig

#: the memory categories, in the order they are printed


@dataclass
class RankMeasure:
    """What one rank's dry-run step measured (see the module docstring)."""

    rank: int
    coord: dict[str, int]
    peak: int
    moment: str
    memory: dict[str, int]
    comm: dict[tuple[str, str], tuple[int, int]]     # (dim, op) -> (calls, bytes)
    seconds: float
    host_violations: list[str] = field(default_factory=list)
    optimizer: str = ""            # the AdamW implementation stepped (axgrid.adamw_kind): the drivers' too


class PeakWatch(mt.LiveBytes):
    """:class:`~axgrid.metrics.memtrack.LiveBytes` that also notes where its peak was reached: the phase the step is
    in (``phase``, set by the caller), the innermost module running its forward (``module``), the autograd node
    running (in backward) and the operator."""

    def __init__(self, existing: Any = ()) -> None:
        super().__init__(existing)
        self.phase, self.module, self.moment = "", "", ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.peak
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.peak > before:
            node = torch._C._current_autograd_node()
            where = node.name() if node is not None else (self.module or "outside the modules (the loss)")
            self.moment = f"{self.phase}, {where}, {func}"
        return out

    @contextlib.contextmanager
    def modules(self, model: torch.nn.Module, names: Any = None) -> Iterator[None]:
        """Keep ``module`` the innermost named module whose forward is running (of ``names``; default: the GPT's
        ``blocks.3``, ``blocks.3.up``, ``head``, ..., not their insides)."""
        stack: list[str] = []
        handles = []
        for name, mod in model.named_modules():
            if not name or (name not in names if names is not None else name.count(".") > 1):
                continue

            def pre(m, a, name=name):
                stack.append(name)
                self.module = name

            def post(m, a, o):
                stack.pop()
                self.module = stack[-1] if stack else ""
            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def runtime_config(cfg: DryRunConfig, **overrides: Any):
    """The runtime's configuration of a dry run (and of a real run compared with it)."""
    import axgrid
    kw = dict(timeout_s=60, seed=0, overlap=axgrid.OverlapConfig.parse(cfg.overlap), bucket_bytes=cfg.bucket_bytes,
              flight_records=0, zero=cfg.zero)
    kw.update(overrides)
    return axgrid.RuntimeConfig(**kw)


def measure_rank(cfg: DryRunConfig, rank: int) -> RankMeasure:
    """Run one rank's step on the fakegpu device (module docstring). Needs a process that may register the device
    (:func:`.harness.accelerator`; ``python -m axgrid.dryrun`` is one)."""
    from .harness import dry_run

    start = time.perf_counter()
    # the backward on the calling thread: the engine's device thread for fakegpu more than doubles the time (a
    # handover per node, fake dispatch holding the GIL)
    with dry_run(cfg.grid, rank=rank, device="fakegpu", config=runtime_config(cfg), cp=cfg.cp,
                 ep=cfg.ep) as run, \
            torch.autograd.set_multithreading_enabled(False):
        return measure_step(cfg, run.grid, run.autocast, run.host, init=False, start=start)


@dataclass
class _Model:
    """The model a step trains: ``loss(inputs, targets, normalizer)``; ``tags``: its blocks (in order) and the
    modules around them, by name, whose saved tensors are the activations; ``watched``: the modules the peak's
    moment names (None: the GPT's default)."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss: Any
    tags: dict[str, torch.nn.Module]
    watched: Any = None


def _build(cfg: DryRunConfig, grid: Any, init: bool) -> _Model:
    """``cfg``'s model on ``grid`` with the drivers' AdamW (:func:`axgrid.adamw`: fused on the fakegpu device, as on a
    GPU; sharded over d as the grid's zero says)."""
    import axgrid
    if cfg.hf:
        from axgrid.plans.causal_lm import causal_lm_from_config, causal_lm_loss
        from .harness import FakeGpuDevice, hf_attention
        fake = isinstance(grid.accelerator, FakeGpuDevice)     # a dry run's: no mask built from fake ids
        model = causal_lm_from_config(cfg.model.path or cfg.model.hf_config(), grid, recompute=cfg.recompute,
                                      init=init, attention=hf_attention() if fake else "sdpa")
        decoder = model.get_decoder()
        if fake:          # fake tensors hold no router choices to count: perfmodel's uniform routing
            from axgrid.expert_parallel import ExpertParallelMoE
            from axgrid.expert_parallel.dispatch import uniform_routing
            for block in model.modules():
                if isinstance(block, ExpertParallelMoE):
                    block.planner = uniform_routing
        tags = {f"model.layers.{i}": b for i, b in enumerate(decoder.layers)}
        tags.update({"model.norm": decoder.norm, "lm_head": model.lm_head, "model.embed_tokens": decoder.embed_tokens})

        def loss(inputs: torch.Tensor, targets: torch.Tensor, normalizer: float) -> torch.Tensor:
            return causal_lm_loss(model, inputs, targets, None, normalizer)
        watched = {n for n, _ in model.named_modules() if n in tags or (n.count(".") == 3 and n.startswith(
            "model.layers."))}                 # model.layers.3, model.layers.3.mlp, lm_head, ...
    else:
        from axgrid.models.gpt import GPT
        model = GPT(cfg.gpt_config(), grid, init=init)
        tags = {f"blocks.{i}": b for i, b in enumerate(model.blocks)}
        tags.update({"ln_f": model.ln_f, "head": model.head, "wte": model.wte, "wpe": model.wpe})

        def loss(inputs: torch.Tensor, targets: torch.Tensor, normalizer: float) -> torch.Tensor:
            return model(inputs, targets, normalizer=normalizer)
        watched = None
    if cfg.lora_r:        # the base frozen, adapters on the targets (before the buckets are built), as finetune.py
        axgrid.lora(model, grid, r=cfg.lora_r, alpha=2.0 * cfg.lora_r, targets=cfg.lora_layers)
    grid.watch(model)
    groups = [p for p in model.parameters() if p.requires_grad] if cfg.hf else model.optimizer_groups(0.1)
    opt = axgrid.shard_optimizer(axgrid.adamw(groups, lr=1e-4, weight_decay=0.01), model, grid)   # the drivers' AdamW
    return _Model(model, opt, loss, tags, watched)


def measure_step(cfg: DryRunConfig, grid: Any, autocast: Any, host: Any = None, init: bool = True,
                 start: float | None = None) -> RankMeasure:
    """One step of ``cfg``'s model (the GPT, or a Hugging Face config's) on ``grid`` (a dry run's, or real ranks' to
    compare with), measured (module docstring). ``autocast(dtype)``: the device's autocast context; ``host``: a
    :class:`.harness.HostWatch` active during the measured step (and a fresh one during the first: the library's
    intended host reads answer there), None: none; ``init=False``: weights left uninitialised (fake tensors)."""
    import axgrid
    from axgrid.train import train_step

    start = time.perf_counter() if start is None else start
    dev = grid.device
    built = _build(cfg, grid, init)
    model, opt, tags = built.module, built.optimizer, built.tags
    layers = cfg.model.layers
    m = cfg.microbatches
    rows = cfg.sequences_per_microbatch // grid.size("d")          # this data-parallel rank's sequences
    ids = torch.zeros((rows, cfg.model.seq + 1), dtype=torch.long, device=dev)
    normalizer = float(cfg.batch * cfg.model.seq)
    saved = _Saved(tags, exclude=model.parameters(), inputs_of=list(tags)[:layers] if cfg.recompute else (),
                   inputs=(ids,))
    kept: list = []
    live: PeakWatch | None = None

    def loss_of(i: int) -> torch.Tensor:
        record = saved if live is not None and i == m - 1 else contextlib.nullcontext()
        if live is not None:
            live.phase = f"micro-batch {i + 1}/{m} forward"
        kept.clear()
        with autocast(torch.bfloat16) if cfg.dtype == "bf16" else contextlib.nullcontext(), record:
            loss = built.loss(ids[:, :-1], ids[:, 1:], normalizer)
        if record is saved:
            saved.exclude(mt.live_keys(kept))      # kept gathered blocks: weight buffers, not activations
        if live is not None:
            live.phase = f"micro-batch {i + 1}/{m} backward"
            loss.register_hook(lambda g, i=i: _after_backward(live, i, m) or g)
        return loss

    # a first step: AdamW's state and the prefetched weights (OAG) exist from here on, as in every step of a
    # training run after its first (without it the measured step gathers half the weight bytes OAG holds)
    with type(host)() if host is not None else contextlib.nullcontext():
        train_step(model, opt, loss_of, grid, microbatches=1, clip=1.0)
    rt = grid.runtime
    params = list(model.parameters())
    trained = [p for p in params if p.requires_grad]           # all of them but a LoRA model's frozen base
    lay = getattr(trained[0], "axgrid_buckets", None)         # the data-parallel buckets (Gd > 1)
    share = lay.buffers()["grads"] if cfg.zero == 2 else []    # zero=2: the gradients' shares
    memory = {"parameters": mt.storage_bytes(params),
              "optimizer": mt.storage_bytes(mt.optimizer_tensors(opt))}
    live = PeakWatch()
    live.track(itertools.chain(params, (p.grad for p in params), share, mt.optimizer_tensors(opt)))
    opt.register_step_pre_hook(lambda *a: setattr(live, "phase", "optimizer step"))
    grid.ledger.reset()
    with live, live.modules(model, built.watched), mt.watch_weight_source(rt, live, kept=kept), \
            mt.watch_bucket_allocations(lay, live), \
            host if host is not None else contextlib.nullcontext():
        train_step(model, opt, loss_of, grid, microbatches=m, clip=1.0)
    memory["gradients"] = mt.storage_bytes(itertools.chain((p.grad for p in params), share))
    memory["buckets"] = live.category_peak("buckets")
    memory["gathered"] = live.category_peak("gathered")
    memory["activations"] = saved.total
    memory["temporaries"] = live.peak - sum(memory.values())
    comm = {k: (e.calls, e.bytes) for k, e in grid.ledger.snapshot().items()}
    return RankMeasure(grid.rank, {c: grid.coord[c] for c in "xyzd"}, live.peak, live.moment, memory, comm,
                       time.perf_counter() - start, [str(v) for v in host.violations] if host else [],
                       axgrid.adamw_kind(opt))


class _Saved(mt.SavedBytes):
    """:class:`~axgrid.metrics.memtrack.SavedBytes` as perfmodel counts activations: a saved view of the step's
    input (``inputs``: the token buffer, which the caller holds anyway) counts as the ids it holds (8 B per token),
    not as the whole buffer; and flash attention's random-number seed and offset (uint64 scalars: on a GPU without
    dropout, host tensors) are not device memory."""

    def __init__(self, tags: dict, exclude: Any = (), inputs_of: Any = (), inputs: Any = ()) -> None:
        super().__init__(tags, exclude=exclude, inputs_of=inputs_of)
        self.inputs = {mt.storage_key(t) for t in inputs}

    def record(self, t: torch.Tensor, tag: str) -> None:
        if t.dtype == torch.uint64:
            return
        if mt.storage_key(t) in self.inputs:
            key = ("input", id(t), tag)
            self.records.setdefault(key, (tag, t.numel() * t.element_size()))   # type: ignore[arg-type]
            return
        super().record(t, tag)


def _after_backward(live: "PeakWatch", i: int, m: int) -> None:
    """From the start of micro-batch i's backward: at its end, the step moves on (sync, clipping) -- noted then."""
    def done() -> None:
        live.phase = (f"after micro-batch {i + 1}/{m}'s backward" if i < m - 1
                      else "gradient sync and clipping")
    torch.autograd.Variable._execution_engine.queue_callback(done)
