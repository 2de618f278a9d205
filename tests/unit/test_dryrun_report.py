"""The dry run's table (axgrid/dryrun/report.py) says what each figure is: the host's time to run the fake step as
such, perfmodel's s/batch and band beside it, and no negative size (torch-free: a measure built by hand, perfmodel's
prediction as the dry run computes it)."""
from types import SimpleNamespace

from axgrid import perfmodel as pm
from axgrid.dryrun.config import CATEGORIES, predict, resolve
from axgrid.dryrun.report import rank_json, table


def _measure(memory: dict[str, int]) -> SimpleNamespace:
    return SimpleNamespace(rank=0, coord={"x": 0, "y": 0, "z": 0, "d": 0}, seconds=6.9, memory=memory,
                           peak=sum(memory.values()), moment="backward", comm={}, host_violations=[])


def test_gpt20b_on_256_frontier_gcds_shows_perfmodels_time_and_no_negative_size():
    cfg = resolve("gpt-20b", 256, 512, machine="frontier")
    p = predict(cfg)
    assert p.memory["temporaries"] < 0          # perfmodel's categories (the buckets' bound) exceed its peak here
    row = pm.price_grid(cfg.problem(), pm.load_machine("frontier"), cfg.shape)
    m = _measure({c: (1 << 30) if c != "temporaries" else 1_470_000_000 for c in CATEGORIES})
    out = table(cfg, m, p)
    head = out.splitlines()[0]
    assert "this host ran the step on fake devices in 6.9 s (host time, not a GPU's)" in head
    assert f"perfmodel: {row.time_s:.3f} s/batch on frontier (band {row.time_low:.3g}–{row.time_high:.3g} s)" in head
    sizes = [line[:44] for line in out.splitlines()
             if line.split()[0] in (*CATEGORIES, "peak") and "reached" not in line]
    assert len(sizes) == len(CATEGORIES) + 1 and not any("-" in s for s in sizes), sizes    # the two size columns
    temp = next(line for line in out.splitlines() if line.strip().startswith("temporaries"))
    assert "none left" in temp and "perfmodel's other categories exceed its peak by 1.74 GiB" in temp
    assert rank_json(m, p)["predicted_step"] == p.step


def test_a_hugging_face_config_is_priced_and_lora_on_it_says_its_time_is_not_modelled(tmp_path):
    import json
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}))
    cfg = resolve(str(tmp_path), None, 4, grid="1x2x2x1", machine="local-4", seq=16)
    assert " s/batch on local-4 (" in predict(cfg).step
    lora = resolve(str(tmp_path), None, 4, grid="1x2x2x1", machine="local-4", seq=16, lora_r=2)
    assert "s/batch not modelled for LoRA on a Hugging Face decoder" in predict(lora).step


def test_zero0_buckets_may_hold_the_used_flags_in_flight_and_nothing_else():
    """With zero 0 the buckets' category holds one int32 per trained parameter while their all-reduce over d is
    in flight behind the last bucket: the dry run of GPT-320B on 2x2x64x128 measured 4,628 B there (96 blocks x
    12 tensors + 5; docs/results.md); perfmodel's bound is exactly that, nothing with Gd = 1 or zero >= 1, and a
    byte more is a disagreement."""
    from axgrid.dryrun.report import bucket_bounds, disagreements
    cfg = resolve("gpt-320b", None, 32768, grid="2x2x64x128", zero=0, machine="frontier")
    p = predict(cfg)
    assert p.used_flags == 4 * (96 * 12 + 5) == 4628
    assert bucket_bounds(0, p) == (0, 4628)
    assert predict(resolve("gpt-320b", None, 32768, grid="2x2x64x128", zero=1, machine="frontier")).used_flags == 0
    assert predict(resolve("gpt-tiny", None, 8, grid="2x2x2x1", zero=0)).used_flags == 0
    memory = {c: p.memory[c] for c in CATEGORIES}
    m = _measure({**memory, "buckets": 4628})
    m.peak, m.comm = p.peak, p.comm
    assert not [d for d in disagreements(m, p, 0) if "buckets" in d]
    m.memory["buckets"] = 4629
    assert [d for d in disagreements(m, p, 0) if "buckets" in d]
