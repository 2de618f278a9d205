"""Expert parallelism priced (axgrid/perfmodel/moe.py, the step replay's MoE events) against the dry run (the real
runtime's step on the fakegpu device, ``axgrid.init(..., ep=N)``, a Hugging Face MoE config built by its plan): every
collective's calls and bytes equal perfmodel's -- the all-to-alls over "e", the counts' exchange, the router's
logits over z, the experts' buckets over their replica group "r" -- the parameters, gradients, optimizer state and
saved activations to the byte, and (zero 0, one micro-batch) the peak within the dry run's 5% (measured -3.4%:
perfmodel holds all local experts' gathered blocks at once, the runtime gathers one at a time). With zero 1 and two micro-batches the
tiny Mixtral's measured peak is 14% above perfmodel's (temporaries of the MoE backward, ~11 KiB, not modelled): not
asserted, reported in the issue. Fake tensors carry no router choices, so the dry run routes
uniformly (``expert_parallel.dispatch.uniform_routing``), perfmodel's assumption: the all-to-alls' bytes are those of
that routing."""
from __future__ import annotations

import json

from axgrid.dryrun import predict, resolve
from axgrid.testing.isolated import run_isolated

COMMON = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 64, "max_position_embeddings": 64, "hidden_act": "silu", "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False, "router_aux_loss_coef": 0.001}
QWEN3_MOE = {"model_type": "qwen3_moe", "head_dim": 8, "intermediate_size": 64, "moe_intermediate_size": 16,
             "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "norm_topk_prob": True}
MIXTRAL = {"model_type": "mixtral", "intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2}


def _config(folder, fields: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**COMMON, **fields}))
    return str(folder / "config.json")


def dry_runs(cfgs: list) -> list:
    """Rank 0's dry run of each configuration (one process)."""
    from axgrid.dryrun.step import measure_rank
    return [measure_rank(c, 0) for c in cfgs]


def test_expert_parallel_dry_run_agrees_with_perfmodel(tmp_path):
    cfgs = [resolve(_config(tmp_path / "qwen3", QWEN3_MOE), None, 8, grid="2x1x2x4", machine="local-4", seq=16,
                    microbatches=1, zero=0, ep=4),                  # every d-rank its own experts: no "r"
            resolve(_config(tmp_path / "mixtral", MIXTRAL), None, 16, grid="2x1x2x4", machine="local-4", seq=16,
                    microbatches=2, zero=1, ep=2)]                  # two replicas of each expert: buckets over "r"
    for cfg, m in zip(cfgs, run_isolated(dry_runs, cfgs, timeout_s=600)):
        p = predict(cfg)
        assert ("e", "all_to_all") in m.comm
        assert (("r", "reduce_scatter") in m.comm) == (cfg.ep < cfg.shape[3])
        assert m.comm == p.comm, (cfg.model.family, m.comm, p.comm)
        for part in ("parameters", "gradients", "optimizer", "activations"):
            assert m.memory[part] == p.memory[part], (cfg.model.family, part, m.memory, p.memory)
        if cfg.zero == 0 and cfg.microbatches == 1:
            assert abs(m.peak - p.peak) <= 0.05 * p.peak, (cfg.model.family, m.peak, p.peak)
