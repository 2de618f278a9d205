"""perfmodel prices LoRA (``Options.lora_r``, :mod:`axgrid.perfmodel.lora`) as the runtime runs it: the dry run
applies ``axgrid.lora`` to the GPT on the fakegpu device and its ledger equals perfmodel's collectives (bytes and calls
per dimension and operation), its parameters, gradients, optimizer state, gathered blocks and activations equal
perfmodel's to the byte, its buckets are within perfmodel's bound and its peak within 5%: under zero 0/1/2, bf16 and
fp32, with and without recompute, with kept gathered blocks, and with targets whose first adapter is not block 0's
first layer (what block 0 then does not save or post). LoRA's memory is below full training's by what perfmodel
predicts; and the dry run equals launched gloo ranks of the same LoRA step."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.dryrun_real import measure_real_step

from axgrid import perfmodel as pm
from axgrid.dryrun import predict, resolve
from axgrid.dryrun.report import bucket_bounds
from axgrid.perfmodel.lora import lora_flops_change, lora_plan
from axgrid.testing.isolated import run_isolated

PEAK_TOLERANCE = 0.05
EXACT = ("parameters", "gradients", "optimizer", "gathered", "activations")
# (grid, zero, lora r, dtype, recompute, targets (None: the block's four), overlap)
CASES = [
    ("2x2x2x2", 0, 4, "bf16", True, None, "all"),
    ("2x2x2x2", 1, 4, "bf16", True, None, "all"),
    ("2x2x2x2", 2, 4, "bf16", True, None, "all"),
    ("2x2x2x2", 0, 4, "bf16", False, None, "all"),
    ("1x2x2x2", 2, 8, "bf16", False, ("qkv", "proj"), "all"),
    ("2x1x2x2", 1, 4, "bf16", False, ("proj",), "none"),
    ("2x2x1x2", 0, 4, "bf16", False, ("up", "down"), "oar,oag"),
    ("2x2x2x1", 0, 4, "fp32", False, ("down",), "all,keep"),
    ("2x2x2x2", 2, 4, "bf16", False, ("qkv", "head"), "all"),
]


def _config(grid, zero, r, dtype, recompute, targets, overlap):
    return resolve("gpt-tiny", None, 8, grid=grid, machine="local-4", microbatches=2, zero=zero, lora_r=r,
                   lora_targets=targets, dtype=dtype, recompute=recompute, overlap=overlap, bucket_bytes=4096)


def _full_and_lora():
    """Full training and LoRA (every block layer adapted) on the same grid, zero 1, without recompute."""
    full = resolve("gpt-tiny", None, 8, grid="2x2x2x2", machine="local-4", microbatches=2, zero=1,
                   recompute=False, bucket_bytes=4096)
    return full, _config("2x2x2x2", 1, 4, "bf16", False, None, "all")


def _gloo_config():
    """The LoRA step compared with launched gloo ranks."""
    return resolve("gpt-tiny", None, 4, grid="2x1x1x2", machine="local-4", microbatches=2, zero=1, lora_r=4,
                   lora_targets=("qkv", "down"), dtype="fp32", recompute=True, overlap="all", bucket_bytes=4096)


def _dry_all(pairs):
    """``pairs``: [(config, rank), ...]; their dry runs, one after another in this process."""
    from axgrid.dryrun.step import measure_rank
    return [measure_rank(cfg, rank) for cfg, rank in pairs]


#: Isolated processes the module's dry runs are dealt to, measured side by side (each warms its fake-tensor caches
#: once; two use both cores of a 2-core machine).
DRY_PROCESSES = 2


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict:
    """Every dry run of this module, dealt in turn to DRY_PROCESSES isolated processes that measure side by side:
    "cases" (CASES, last rank), "full_and_lora" (last rank), "gloo" (ranks 0 and 3), "hf" (HF_CASES, last rank);
    beside each, its configurations."""
    cases = [_config(*c) for c in CASES]
    hf = _hf_configs(tmp_path_factory.mktemp("hf_lora"))
    gloo = _gloo_config()
    runs = {"cases": [(cfg, cfg.gpus - 1) for cfg in cases],
            "full_and_lora": [(cfg, cfg.gpus - 1) for cfg in _full_and_lora()],
            "gloo": [(gloo, 0), (gloo, gloo.gpus - 1)],
            "hf": [(cfg, cfg.gpus - 1) for cfg in hf]}
    keys = [(name, i) for name, pairs in runs.items() for i in range(len(pairs))]
    dealt = [keys[k::DRY_PROCESSES] for k in range(DRY_PROCESSES)]
    with ThreadPoolExecutor(DRY_PROCESSES) as pool:
        futures = [pool.submit(run_isolated, _dry_all, [runs[n][i] for n, i in part], timeout_s=600) for part in dealt]
        measured = {key: m for part, f in zip(dealt, futures) for key, m in zip(part, f.result())}
    return {name: ([cfg for cfg, _ in pairs], [measured[name, i] for i in range(len(pairs))])
            for name, pairs in runs.items()}


def test_the_lora_dry_run_equals_perfmodel_to_the_byte(dry_runs):
    cfgs, measured = dry_runs["cases"]
    errors = []
    for case, cfg, m in zip(CASES, cfgs, measured):
        p = predict(cfg)
        if m.comm != p.comm:
            errors.append(f"{case}: ledger {m.comm}, perfmodel {p.comm}")
        errors += [f"{case}: {k} {m.memory[k]} measured, {p.memory[k]} predicted" for k in EXACT
                   if m.memory[k] != p.memory[k]]
        low, high = bucket_bounds(cfg.zero, p)
        if not low <= m.memory["buckets"] - 4 * 2 * _adapters(cfg) * (cfg.zero == 0) <= high:
            errors.append(f"{case}: buckets {m.memory['buckets']} outside {low}..{high}")
        if abs(m.peak / p.peak - 1) > PEAK_TOLERANCE:
            errors.append(f"{case}: peak {m.peak} measured, {p.peak} predicted ({m.moment})")
    assert not errors, "\n".join(errors)


def _adapters(cfg) -> int:
    """Adapted layers on a rank (zero=0's int32 used-flag per trainable tensor, A and B, is allocated with the
    buckets at the end of the backward)."""
    plan = lora_plan(cfg.model, cfg.options())
    blocks = sum(1 for layer in cfg.model.block_layers() if plan.targeted(layer))
    return cfg.model.layers * blocks + plan.targeted(cfg.model.head_layer()) if cfg.shape[3] > 1 else 0


def test_lora_memory_is_below_full_training_by_what_perfmodel_predicts(dry_runs):
    (full, lora), (m_full, m_lora) = dry_runs["full_and_lora"]
    p_full, p_lora = predict(full), predict(lora)
    for k in EXACT:
        assert m_full.memory[k] - m_lora.memory[k] == p_full.memory[k] - p_lora.memory[k], k
    static = ("parameters", "gradients", "optimizer")
    saved = sum(m_full.memory[k] - m_lora.memory[k] for k in static)
    assert saved == sum(p_full.memory[k] - p_lora.memory[k] for k in static)
    assert saved > 0.7 * sum(m_full.memory[k] for k in ("gradients", "optimizer"))   # gradients and moments gone


def test_the_lora_dry_run_equals_gloo_ranks(ranks, dry_runs):
    (cfg, _), dry = dry_runs["gloo"]
    got = ranks(cfg.gpus, measure_real_step, cfg)
    for r, d in zip((0, cfg.gpus - 1), dry):
        assert d.comm == got[r].comm, (r, d.comm, got[r].comm)
        for k in ("parameters", "gradients", "optimizer", "activations"):
            assert d.memory[k] == got[r].memory[k], (r, k, d.memory[k], got[r].memory[k])
        assert abs(d.peak / got[r].peak - 1) <= PEAK_TOLERANCE, (r, d.peak, got[r].peak)


def test_lora_options_are_checked_in_one_line():
    spec = pm.get_model("gpt-tiny")
    with pytest.raises(pm.PerfModelError, match="'q_proj' is no FC layer of gpt-tiny; its layers are qkv, proj"):
        lora_plan(spec, pm.Options(lora_r=4, lora_targets=("q_proj",)))
    with pytest.raises(pm.PerfModelError, match="lora_r=-1"):
        pm.Options(lora_r=-1)
    with pytest.raises(pm.PerfModelError, match="at least one block layer"):
        pm.memory.memory_per_gpu(spec, 1, 1, 1, 1, 64, 2, False, pm.Options(lora_r=4, lora_targets=("head",)))


def test_lora_flops_drop_the_weight_gradients_and_add_the_adapters():
    spec = pm.get_model("gpt-tiny")
    plan = lora_plan(spec, pm.Options(lora_r=4))
    h, L, V, m = spec.hidden, spec.layers, spec.vocab, 1000
    weight_grads = 2.0 * m * (L * 12 * h * h + V * h)
    adapters = 2.0 * m * 4 * L * ((3 * h + h) + (h + h) + (4 * h + h) + (h + 4 * h))   # r·(k + n) per layer
    assert lora_flops_change(spec, plan, m, recompute=True) == pytest.approx(4 * adapters - weight_grads)
    assert lora_flops_change(spec, plan, m, recompute=False) == pytest.approx(3 * adapters - weight_grads)


# (grid, zero, targets, tied): q, k, v read one input (so do gate and up): without recompute block 0's k and v have
# no backward when q holds its first adapter (the last case); with recompute transformers' checkpointing makes the
# layers' input need a gradient
HF_CASES = [
    ("2x2x1x2", 1, ("q_proj", "v_proj"), False),
    ("1x2x2x2", 2, None, True),
    ("2x1x2x1", 0, ("o_proj", "up_proj"), False),
    ("2x2x1x2", 1, ("q_proj", "v_proj"), False),
]


def _hf_configs(tmp_path) -> list:
    """HF_CASES as dry-run configurations of small Llama config.json files written under ``tmp_path``."""
    import json
    import os
    cfgs = []
    for i, (grid, zero, targets, tied) in enumerate(HF_CASES):
        folder = tmp_path / f"llama{i}"
        os.makedirs(folder)
        with open(folder / "config.json", "w") as f:
            json.dump({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64,
                       "max_position_embeddings": 64, "hidden_act": "silu", "rms_norm_eps": 1e-5,
                       "tie_word_embeddings": tied}, f)
        cfgs.append(resolve(str(folder / "config.json"), None, 8, grid=grid, machine="local-4", microbatches=2,
                            zero=zero, seq=16, lora_r=4, lora_targets=targets, bucket_bytes=4096,
                            recompute=i < 2))
    return cfgs


def test_a_hugging_face_lora_dry_run_equals_perfmodel_decoder(dry_runs):
    cfgs, measured = dry_runs["hf"]
    for case, cfg, m in zip(HF_CASES, cfgs, measured):
        p = predict(cfg)
        assert m.comm == p.comm, (case, m.comm, p.comm)
        for k in ("parameters", "gradients", "optimizer"):
            assert m.memory[k] == p.memory[k], (case, k, m.memory[k], p.memory[k])
