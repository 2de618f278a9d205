"""One AdamW (axgrid.adamw) for the drivers and the dry run: train_gpt steps the implementation the dry run
measures, on the fakegpu device and on real ranks alike (fused: torch 2.13 has the kernel on CPU, CUDA and the
privateuse1 backend), and the implementation matters to the step's memory -- torch's default for-each AdamW, what
the drivers ran before, holds a 4-byte temporary per parameter element at the step, the fused one none -- so the
dry run's memory is the drivers' only when both build the same."""
import json

import torch

import axgrid
from axgrid.dryrun import resolve
from axgrid.metrics import memtrack as mt
from axgrid.testing.isolated import run_isolated
from helpers import load_script


def rank_train_gpt(log: str) -> str:
    """train_gpt's optimizer, as its log's config row says."""
    load_script("train/train_gpt.py").main(["--steps", "1", "--no-progress", "--log", log])
    return json.loads(open(log).readline())["optimizer"]


def rank_real_dry_run(cfg) -> tuple[str, int]:
    from axgrid.dryrun.step import measure_step, runtime_config
    grid = axgrid.init(cfg.grid, config=runtime_config(cfg))
    try:
        m = measure_step(cfg, grid, lambda dtype: torch.autocast("cpu", dtype=dtype))
        return m.optimizer, m.memory["optimizer"]
    finally:
        grid.destroy()


def dry(cfg):
    from axgrid.dryrun.step import measure_rank
    return measure_rank(cfg, 0)


def test_the_drivers_and_the_dry_run_step_the_same_adamw(ranks, tmp_path):
    cfg = resolve("gpt-tiny", None, 4, grid="1x1x1x1", machine="local-4", dtype="fp32", microbatches=1)
    driver = ranks(1, rank_train_gpt, str(tmp_path / "run.jsonl"))[0]
    real_kind, real_bytes = ranks(1, rank_real_dry_run, cfg)[0]
    fake = run_isolated(dry, cfg, timeout_s=300)
    assert driver == f"AdamW ({real_kind})" == f"AdamW ({fake.optimizer})" == "AdamW (fused)"
    assert fake.memory["optimizer"] == real_bytes        # the fused step's 0-d steps live on the device: counted


def _step_peak(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> int:
    """Bytes allocated at the optimizer's step beyond what it holds before and after (its temporaries)."""
    opt.step()                                           # the state exists from here on, as after a first step
    live = mt.LiveBytes(params + [p.grad for p in params] + mt.optimizer_tensors(opt))
    with live:
        opt.step()
    return live.peak - live.current


def test_the_factory_steps_without_the_foreach_temporaries():
    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (128, 64)]
    elements = sum(torch.Size(s).numel() for s in shapes)
    peaks = {}
    for kind in ("factory", "foreach"):
        params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = (axgrid.adamw(params, lr=1e-3) if kind == "factory"
               else torch.optim.AdamW(params, lr=1e-3, foreach=True))
        peaks[kind] = _step_peak(opt, params)
    assert axgrid.adamw_kind(axgrid.adamw([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)) == "fused"
    assert peaks["foreach"] >= 4 * elements > peaks["factory"], peaks
