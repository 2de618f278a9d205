"""perfmodel's memory is the runtime's: for axgrid's GPT on every grid of 4 ranks and several of 8, with and without
recompute, OAG and kept gathered weights, in fp32 and under bf16 autocast, the bytes ``perfmodel.memory`` predicts
per component equal what one rank holds. Measured with ``axgrid.metrics.memtrack``:

- parameters, gradients and AdamW state (moments and 0-d steps): the bytes of the tensors' storages -- exactly --
  in each ``zero`` mode (with Gd > 1 the gradients are the data-parallel buckets: no second copy; ``zero`` >= 1:
  the parameters are bucket views too, AdamW's state covers this rank's share, ``zero=2`` keeps only the gradient
  share; the rank with d > 0 may hold up to Gd - 1 fewer padded elements per bucket); no bucket allocation besides,
  except with ``zero=2`` the full gradient buckets of the backward (``dp_buckets``), whose peak over the step is at
  most what the model lets be alive at once (the peak below checks where they fall);
- activations saved for backward, per block, for the head (final layer norm, LM head, cross entropy) and for the
  embeddings: ``saved_tensors_hooks`` during a forward, each storage once (views -- q, k, v of the QKV output, the
  attention output's reshape -- count as their base; parameters, among them the weight shards a layer saves, are
  left out, and with keep the gathered blocks a layer saves count as gathered buffers, not activations; under
  recompute, the block inputs the checkpoint keeps) -- exactly;
- gathered weight buffers: the peak of live storages allocated by the runtime's weight source -- exactly;
- the step's peak of live tensor bytes (a TorchDispatchMode following storage lifetimes) in a step of two
  micro-batches (the second starts with gradients live, as the model prices it) -- within 5% (6% for the math
  attention cases, see MATH_PEAK_TOLERANCE).

Under bf16 autocast the weight blocks are gathered over z in bf16 (the runtime casts each shard into its slot of the
gather's output), and the model prices them so.

The model is asked for the CPU's device (``perfmodel.memory.CPU_GLOO``): SDPA's flash kernel on the CPU (saves the
QKV output through its q, k, v views, the output and the log-sum-exp), gloo's fp32 sums of bf16 and its
reduce-scatter's copy. Two cases force the math kernel (``attention="math"``: q, k, v copies and the probabilities,
computed in fp32 on the CPU). One rank-pool call per grid runs all its cases.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os

import pytest

from helpers import slow_where
import torch

import axgrid
from axgrid import perfmodel as pm
from axgrid.perfmodel.memory import CPU_GLOO, memory_per_gpu
from axgrid.spec import TransformerShape

# layers, hidden, heads, seq, vocab: Gx, Gy up to 8 divide hidden, 4·hidden, heads and vocab
SIZES = (2, 32, 8, 32, 64)
SEQS = 2               # sequences per z-rank per micro-batch: m' = 64 tokens
MICROBATCHES = 2
PEAK_TOLERANCE = 0.05
# the CPU's unfused (math) attention: its saved bytes agree exactly, but one case's peak is 5.3% above the model
# (something probability-sized lives in its backward that it does not save; not modelled, GPUs run fused kernels)
MATH_PEAK_TOLERANCE = 0.06
ZERO_BUCKET = 4096      # bytes: the zero cases' buckets (several per model, so that zero=2's shares show)

# (grid, [(overlap, recompute, dtype, attention[, zero]), ...]): together every option in both dtypes and recompute
# states, and each zero mode with and without ODP
CASES = [
    ("4x1x1x1", [("none", False, "fp32", "flash"), ("oar", True, "bf16", "flash")]),
    ("1x4x1x1", [("none", True, "bf16", "flash"), ("none", False, "fp32", "math")]),
    ("1x1x4x1", [("oag", False, "fp32", "flash"), ("keep", True, "bf16", "flash"),
                 ("oag,keep", False, "bf16", "flash")]),
    ("1x1x1x4", [("none", False, "fp32", "flash"), ("odp", True, "bf16", "flash"), ("odp", False, "fp32", "flash", 2),
                 ("none", True, "bf16", "flash", 1)]),
    ("2x2x1x1", [("none", True, "fp32", "flash"), ("oar", False, "bf16", "flash")]),
    ("2x1x2x1", [("oag,ors", False, "bf16", "flash"), ("keep", False, "fp32", "flash")]),
    ("1x2x2x1", [("none", True, "bf16", "flash"), ("all,keep", False, "fp32", "flash")]),
    ("2x1x1x2", [("odp", False, "fp32", "flash"), ("none", True, "bf16", "flash")]),
    ("1x2x1x2", [("all", True, "fp32", "flash"), ("none", False, "bf16", "math"), ("none", False, "fp32", "flash", 2)]),
    ("1x1x2x2", [("all", False, "bf16", "flash"), ("oag,keep", True, "fp32", "flash"),
                 ("all", False, "fp32", "flash", 1), ("ors", False, "bf16", "flash", 2)]),
    ("2x2x2x1", [("all", True, "bf16", "flash"), ("keep", False, "fp32", "flash")]),
    ("2x2x1x2", [("oar,odp", False, "bf16", "flash"), ("none", True, "fp32", "flash")]),
    ("8x1x1x1", [("none", False, "bf16", "flash"), ("none", True, "fp32", "flash")]),
]


def _batch(grid, i: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * grid.index("d") + i)
    return torch.randint(0, SIZES[4], (SEQS * grid.size("z"), SIZES[3] + 1), generator=gen)


def measure(cases: list[tuple]) -> list[dict]:
    """On one rank, per case: the bytes it holds by component (see the module docstring). Step 1 (one micro-batch)
    makes the optimizer state and the bucket buffers; step 2 (two) is measured, its last forward's saved tensors
    recorded."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from axgrid.metrics import memtrack as mt
    from axgrid.models.gpt import GPT, GPTConfig
    from axgrid.train import train_step
    torch.set_num_threads(1)
    layers, hidden, heads, seq, vocab = SIZES
    out = []
    for spec, overlap, recompute, dtype, attention, *zero in cases:
        zero = zero[0] if zero else 0
        kw = {"bucket_bytes": ZERO_BUCKET} if zero else {}
        grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, overlap=axgrid.OverlapConfig.parse(overlap),
                                                             seed=0, zero=zero, **kw))
        try:
            shape = TransformerShape("test", layers, hidden, heads, seq, vocab)
            model = GPT(GPTConfig(shape, recompute=recompute), grid)
            grid.watch(model)
            opt = axgrid.shard_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model, grid)
            batches = [_batch(grid, i) for i in range(MICROBATCHES)]
            norm = float(MICROBATCHES * SEQS * grid.size("z") * seq)
            tags = {f"blocks.{i}": b for i, b in enumerate(model.blocks)}
            tags.update({"ln_f": model.ln_f, "head": model.head, "wte": model.wte, "wpe": model.wpe})
            saved = mt.SavedBytes(tags, exclude=model.parameters(), inputs_of=list(tags)[:layers] if recompute else ())
            kept: list = []
            measuring = [False]              # step 2's last forward is recorded

            def forward(i: int) -> torch.Tensor:
                kernel = sdpa_kernel(SDPBackend.MATH) if attention == "math" else contextlib.nullcontext()
                record = saved if measuring[0] and i == MICROBATCHES - 1 else contextlib.nullcontext()
                kept.clear()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"), kernel, record:
                    loss = model(batches[i][:, :-1], batches[i][:, 1:], normalizer=norm)
                if record is saved:
                    saved.exclude(mt.live_keys(kept))   # kept gathered blocks: weight buffers (shards: parameters)
                return loss

            live = mt.LiveBytes()
            train_step(model, opt, forward, grid, 1)       # optimizer state exists from here on
            rt = grid.runtime
            lay = getattr(next(model.parameters()), "axgrid_buckets", None)   # the data-parallel buckets (Gd > 1)
            share = lay.buffers()["grads"] if zero == 2 else []                # zero=2: the gradients' shares
            got = {"params": mt.storage_bytes(model.parameters()),
                   "grads": mt.storage_bytes(itertools.chain((p.grad for p in model.parameters()), share)),
                   "optimizer": mt.storage_bytes(mt.optimizer_tensors(opt)), "d": grid.index("d")}
            live.track(itertools.chain(model.parameters(), (p.grad for p in model.parameters()), share,
                                       mt.optimizer_tensors(opt)))
            measuring[0] = True
            with live, mt.watch_weight_source(rt, live, kept=kept), \
                    mt.watch_bucket_allocations(lay, live, "dp_buckets"):
                train_step(model, opt, forward, grid, MICROBATCHES)
            got["peak"], got["gathered"] = live.peak, live.category_peak("gathered")
            got["dp_buckets"] = live.category_peak("dp_buckets")
            got["largest_bucket"] = max((b.padded for b in lay.buckets), default=0) * 4 if lay else 0  # fp32 grads
            got["flags"] = 4 * len(lay.params) if lay and zero == 0 else 0   # the "used" flags (int32 each)
            by = saved.by_tag
            got["blocks"] = [by.get(f"blocks.{i}", 0) for i in range(layers)]
            got["head"] = by.get("ln_f", 0) + by.get("head", 0) + by.get("other", 0)   # cross entropy: "other"
            got["embeddings"] = by.get("wte", 0) + by.get("wpe", 0)
            out.append(got)
        finally:
            grid.destroy()
    return out


def predicted(spec: str, overlap: str, recompute: bool, dtype: str, attention: str, zero: int = 0):
    layers, hidden, heads, seq, vocab = SIZES
    gx, gy, gz, gd = (int(v) for v in spec.split("x"))
    ov = axgrid.OverlapConfig.parse(overlap)
    opt = pm.Options(overlap_ar=ov.oar, overlap_rs=ov.ors, overlap_ag=ov.oag, overlap_dp=ov.odp,
                     recompute=recompute, keep_gathered=ov.keep_gathered_weights, zero=zero,
                     bucket_bytes=ZERO_BUCKET if zero else axgrid.RuntimeConfig().bucket_bytes)
    model = TransformerShape("test", layers, hidden, heads, seq=seq, vocab=vocab)
    b = 4 if dtype == "fp32" else 2
    device = dataclasses.replace(CPU_GLOO, attention=attention)
    return memory_per_gpu(model, gx, gy, gz, gd, SEQS * seq, b, dtype == "fp32", opt, device=device)


def compare(spec: str, case: tuple, got: dict) -> list[str]:
    """The components that disagree, each as one line (empty when all agree)."""
    m = predicted(spec, *case)
    layers = SIZES[0]
    want_block = float(m.stored_block)
    exact = {"params": m.params, "grads": m.grads, "optimizer": m.optimizer,
             "gathered": m.gathered, "head": m.head_activations, "embeddings": m.embedding_activations}
    gx, gy, gz, gd = (int(v) for v in spec.split("x"))
    # gloo's work object holds the output of an all-gather (the gathered block) and is released by gloo's worker
    # thread after it has completed the work's future: wait() can return, and the next layer's gather allocate, before
    # that thread drops the previous block. So one block more than the model's may be live at the next gather, on a
    # random rank, in a random run: the backend's, not the runtime's (which no longer holds it). Measured at 32e5cbd,
    # LiveBytes instrumented to record the allocating call of every storage live at the category's peak:
    # on 1x1x2x2 (ors, bf16, zero 2), 42 runs x 4 ranks, 40 measurements held exactly one extra block, each allocated
    # by comm.all_gather for an earlier layer: the MLP's [4h, h] (8,192 B) or the head's [vocab, h] (4,096 B, which an
    # earlier version of this test took for half an MLP block); never two extra, never anything else. Allowed: exactly
    # one block of one layer gathered over z (in the compute dtype), nothing else.
    block_bytes = 4 if case[2] == "fp32" else 2
    h, vocab = SIZES[1], SIZES[4]
    extra_blocks = {block_bytes * n * h // (gx * gy) for n in (3 * h, h, 4 * h, vocab)} if gz > 1 else set()
    bad = []
    zero = case[4] if case[4:] else 0
    # one copy of every gradient: zero=0 reduces in place, nothing allocated in the backward; zero=1 only gloo's
    # copies of the buckets it reduce-scatters (at most all of them); zero=2 its full buckets, at most what the
    # model lets be alive at once. gloo's reduce-scatter works on a copy of the bucket it is given, and its worker
    # thread drops that copy (the work's output) after the work's future completes -- the same race as the gathered
    # blocks' above -- so zero=2 may find one earlier bucket's copy still live when it allocates the next full bucket.
    # Measured at 2f30170 (LiveBytes recording the allocating call of each storage live at the category's peak), on
    # 1x2x1x2 (none, fp32, zero 2), 65 runs x 4 ranks: 2 measurements at 20,736 B = the next full bucket (8,192) +
    # gloo's copy of the bucket in flight (8,192) + gloo's copy of the one before (4,352, its reduce-scatter complete);
    # the rest at the model's 17,536. Allowed above the model: at most one bucket's copy (the largest, fp32).
    low, high = {0: (0.0, 0.0), 1: (0.0, float(m.grads)), 2: (1.0, float(m.dp_buckets))}[zero]
    # With zero=0 the end of the backward also all-reduces an int32 flag per parameter (which parameters some
    # d-rank has a gradient for; zero >= 1 does it at the optimizer's step, outside this category).
    late_copy = got["largest_bucket"] if zero == 2 else 0
    if not low <= got["dp_buckets"] - got["flags"] <= high + late_copy:
        bad.append(f"dp_buckets: runtime peak {got['dp_buckets']} (with {got['flags']} of flags), allowed {low:.0f} "
                   f"to {high:.0f} (+ {late_copy} for one bucket copy gloo has not dropped yet)")
    if zero and got["d"] > 0:       # a later d-rank's shares may end in padding: up to Gd - 1 elements per bucket
        model = TransformerShape("test", *SIZES[:3], seq=SIZES[3], vocab=SIZES[4])
        buckets = pm.collective_calls(model, (gx, gy, gz, gd), SIZES[3] * gd * gz, 1, 4, bucket_bytes=ZERO_BUCKET,
                                      zero=1)[("d", "all_gather")]
        want = float(exact.pop("optimizer"))
        if not want - 8 * (gd - 1) * buckets <= got["optimizer"] <= want:
            bad.append(f"optimizer: runtime {got['optimizer']}, model {want:.0f} (d > 0: up to the padding less)")
    bad += [f"{k}: runtime {got[k]}, model {float(v):.0f}" for k, v in exact.items()
            if got[k] != float(v) and not (k == "gathered" and got[k] - float(v) in extra_blocks)]
    bad += [f"block {i}: runtime {got['blocks'][i]}, model {want_block:.0f}" for i in range(layers)
            if got["blocks"][i] != want_block]
    ratio = got["peak"] / float(m.total)
    if abs(ratio - 1) > (MATH_PEAK_TOLERANCE if case[3] == "math" else PEAK_TOLERANCE):
        bad.append(f"peak: runtime {got['peak']}, model {float(m.total):.0f} (ratio {ratio:.3f})")
    if os.environ.get("AXGRID_MEMORY_REPORT"):
        print(f"{spec} {case}: peak runtime/model {ratio:.3f}")
    return bad


@pytest.mark.parametrize("spec,cases", slow_where(CASES, lambda c: c[0] != "1x1x2x2"),
                         ids=[c[0] for c in CASES])
def test_memory_equals_runtime(ranks, spec, cases):
    world = 1
    for v in spec.split("x"):
        world *= int(v)
    per_rank = ranks(world, measure, [(spec, *c) for c in cases])
    errors = []
    for r, results in enumerate(per_rank):
        for case, got in zip(cases, results):
            errors += [f"{spec} {case} rank {r}: {e}" for e in compare(spec, case, got)]
    assert not errors, "\n".join(errors[:40])
