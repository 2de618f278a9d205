"""Context parallelism priced (axgrid/perfmodel/context_parallel.py) against the dry run (the real runtime's step on
the fakegpu device, ``axgrid.init(..., cp=N)``): every collective's calls and bytes, the key-value exchange over
"c" included, equal perfmodel's; the activations a rank saves equal perfmodel's to the byte (recompute off, so each
block's saved set is compared: the all-gather's math-path attention, the ring's q, k, v, output and log-sum-exp);
and what CP adds to the peak equals what perfmodel adds, within 5% of it. GPT with both exchanges, a Llama config
with grouped-query attention (only its key-value heads travel)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from axgrid.dryrun import predict, resolve
from axgrid.testing.isolated import run_isolated


def _llama(folder) -> str:
    fields = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64, "max_position_embeddings": 64,
              "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return str(folder / "config.json")


def dry_pairs(cfgs: list) -> list:
    """Rank 0's dry run of each configuration without and with its CP (one process)."""
    from axgrid.dryrun.step import measure_rank
    return [(measure_rank(dataclasses.replace(c, cp=1), 0), measure_rank(c, 0)) for c in cfgs]


def _case(model, grid: str, cp: int, exchange: str, dtype: str, **kw):
    cfg = resolve(model, None, 4, grid=grid, machine="local-4", dtype=dtype, recompute=False, overlap="all",
                  microbatches=1, zero=0, **kw)
    return dataclasses.replace(cfg, cp=cp, cp_exchange=exchange)


@pytest.mark.parametrize("which", ["gpt", pytest.param("all", marks=pytest.mark.slow)])
def test_context_parallel_dry_run_agrees_with_perfmodel(tmp_path, which):
    cfgs = [_case("gpt-tiny", "1x1x2x1", 2, "all_gather", "bf16")]
    if which == "all":
        cfgs += [_case("gpt-tiny", "2x1x2x1", 2, "ring", "fp32"),
                 _case(_llama(tmp_path / "llama"), "1x1x4x1", 2, "all_gather", "bf16", seq=16),
                 _case(_llama(tmp_path / "llama4"), "1x1x4x1", 4, "all_gather", "fp32", seq=16)]
    for cfg, (serial, cp) in zip(cfgs, run_isolated(dry_pairs, cfgs, timeout_s=600)):
        p, p1 = predict(cfg), predict(dataclasses.replace(cfg, cp=1))
        assert ("c", "all_gather" if cfg.cp_exchange == "all_gather" else "send") in cp.comm
        assert cp.comm == p.comm, (cfg.grid, cfg.cp, cp.comm, p.comm)
        assert cp.memory["activations"] == p.memory["activations"], (cfg.grid, cp.memory, p.memory)
        added, predicted = cp.peak - serial.peak, p.peak - p1.peak
        assert abs(added - predicted) <= max(0.05 * abs(predicted), 1024), (cfg.grid, cfg.cp, added, predicted)
