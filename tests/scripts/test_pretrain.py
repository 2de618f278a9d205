"""experiments/train/pretrain.py from a tiny LlamaConfig and a tiny (tied) Qwen3Config, in-process on 4 real gloo
ranks of 4D grids, on a corpus in Megatron's indexed format: each step's loss equals single-process transformers
training the same initial weights (``init_causal_lm_`` of the dense model) with torch's AdamW and gradient clipping
on the same global batches (also under context parallelism, ``--cp 2 --zero 2``); a run saved after 2 steps and resumed on another grid gives the uninterrupted run's
loss; the export loads back in transformers."""
from __future__ import annotations

import json

import pytest

from helpers import load_script
from helpers.corpus import random_dataset

pytest.importorskip("transformers")

VOCAB, SEQ, BATCH, LR, WD = 256, 16, 8, 3e-3, 0.1
COMMON = ["--seq", str(SEQ), "--batch", str(BATCH), "--microbatches", "2", "--lr", str(LR), "--min-lr", str(LR),
          "--weight-decay", str(WD), "--clip", "1.0", "--no-progress", "--timeout", "60", "--seed", "3"]
CONFIGS = {   # hidden 32, 2 layers, vocabulary 256; GQA; Qwen3: q/k norms, head_dim 16 != 32/4, tied head
    "llama": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  tie_word_embeddings=True)),
    # mixtures of experts (no auxiliary loss in the loss: output_router_logits off, transformers' default)
    "mixtral": ("MixtralConfig", dict(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                      num_experts_per_tok=2, router_jitter_noise=0.0)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                                         num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True)),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import transformers
    root = tmp_path_factory.mktemp("pretrain")
    out = {}
    for kind, (cls, extra) in CONFIGS.items():
        cfg = getattr(transformers, cls)(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         max_position_embeddings=64, **extra)
        cfg.save_pretrained(root / kind)
        out[kind] = str(root / kind / "config.json")
    random_dataset(root / "corpus", docs=60, vocab=16, max_len=80, seed=1)   # ids < 16: learnable
    out["corpus"] = str(root / "corpus")
    return out


def rank_pretrain(argv: list) -> tuple[dict, dict]:
    """main(argv) on this rank; also the rows of each step's global batch this rank read: {step: {row: (x, y)}}
    (under context parallelism, asserted 0 outside its chunks' positions: the corpus read only those)."""
    import torch
    mod = load_script("train/pretrain.py")
    seen: dict = {}
    step_fn = mod.run_step

    def run_step(model, opt, grid, s, step, inputs, targets, metrics, **kw):
        rows = s.rows_read(grid)
        seen[step] = {r: (inputs[r].clone(), targets[r].clone()) for r in rows}
        if grid.size("c") > 1:         # a context-parallel rank read its chunks' tokens only (and their targets)
            from axgrid.context_parallel import sample_spans
            read = torch.zeros(SEQ + 1, dtype=torch.bool)           # the positions of a sample's SEQ + 1 tokens
            for a, b in sample_spans(SEQ, grid.size("c"), grid.index("c")):
                read[a:b] = True
            assert 0 < int(read.sum()) < SEQ + 1
            for x, y in seen[step].values():            # x = tokens 0..S-1, y = tokens 1..S of the sample
                assert not x[~read[:-1]].any() and not y[~read[1:]].any(), (step, grid.rank)
        return step_fn(model, opt, grid, s, step, inputs, targets, metrics, **kw)
    mod.run_step = run_step
    return mod.main(argv), seen


def global_batches(results: list) -> list:
    """Each step's whole batch ``(inputs, targets) [B, S]`` from the rows the ranks read."""
    import torch
    steps = sorted(results[0][1])
    out = []
    for step in steps:
        rows: dict = {}
        for _, seen in results:        # under context parallelism each rank of a group read its chunks: merged
            for r, xy in seen[step].items():
                rows[r] = tuple(torch.maximum(a, b) for a, b in zip(rows[r], xy)) if r in rows else xy
        assert sorted(rows) == list(range(BATCH))
        out.append(tuple(torch.stack([rows[r][i] for r in range(BATCH)]) for i in (0, 1)))
    return out


def transformers_losses(config_json: str, batches: list, seed: int) -> list[float]:
    """Single-process transformers: the dense model of ``config_json`` from the run's initial weights, trained with
    torch's AdamW (decay on matrices) and ``clip_grad_norm_``; the loss of each step before its update."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from axgrid.plans.initial_weights import init_causal_lm_
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_json.rsplit("/", 1)[0]),
                                             dtype=torch.float32, attn_implementation="sdpa")
    init_causal_lm_(model, seed).train()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for inputs, targets in batches:
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind,grid,extra", [("llama", "2x1x1x2", []), ("qwen3", "1x2x2x1", []),
                                             ("llama", "1x1x2x2", ["--cp", "2", "--zero", "2"])])
def test_pretraining_from_a_config_matches_transformers(ranks, files, tmp_path, kind, grid, extra):
    """Also under context parallelism (--cp 2: each sequence's chunks on two z-ranks) with the gradients and
    optimizer state sharded over d (--zero 2)."""
    export = str(tmp_path / "export")
    argv = ["--config", files[kind], "--data-path", files["corpus"], "--grid", grid, "--steps", "3",
            "--export", export] + COMMON + extra
    results = ranks(4, rank_pretrain, argv)
    losses = results[0][0]["losses"]
    assert all(r["losses"] == losses for r, _ in results)
    reference = transformers_losses(files[kind], global_batches(results), seed=3)
    assert losses == pytest.approx(reference, rel=1e-5)
    assert reference[-1] < reference[0]          # it learns: a wrong update could not match by accident
    import torch
    from transformers import AutoModelForCausalLM
    back = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)     # the export loads back
    assert type(back).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]


@pytest.mark.parametrize("kind,grid,ep,zero", [("mixtral", "1x1x1x4", 2, 0), ("qwen3_moe", "2x1x1x2", 2, 1)])
def test_pretraining_a_mixture_of_experts_under_ep_matches_transformers(ranks, files, tmp_path, kind, grid, ep,
                                                                       zero):
    """--ep 2: the experts spread over two d-ranks (on 1x1x1x4 two replicas of each, their gradients reduced over
    those two; beside x with --zero 1), two steps' losses equal transformers' fused-expert model from the same
    initial weights (``init_causal_lm_`` seeds each expert by its grid name); the export (every expert) loads in
    transformers with no weight missing."""
    export = str(tmp_path / "export")
    argv = ["--config", files[kind], "--data-path", files["corpus"], "--grid", grid, "--steps", "2", "--ep",
            str(ep), "--zero", str(zero), "--export", export] + COMMON
    results = ranks(4, rank_pretrain, argv)
    losses = results[0][0]["losses"]
    assert all(r["losses"] == losses for r, _ in results)
    reference = transformers_losses(files[kind], global_batches(results), seed=3)
    assert losses == pytest.approx(reference, rel=1e-5)
    assert reference[-1] < reference[0]
    import torch
    from transformers import AutoModelForCausalLM
    _, info = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_resumed_on_another_grid_gives_the_uninterrupted_loss(ranks, files, tmp_path):
    ck, log = str(tmp_path / "ck"), str(tmp_path / "run.jsonl")
    argv = ["--config", files["llama"], "--data-path", files["corpus"], "--steps", "3", "--recompute", "--log",
            log] + COMMON
    whole = ranks(4, rank_pretrain, argv + ["--grid", "1x2x1x2", "--zero", "1", "--save", ck, "--save-every", "2"])
    rest = ranks(4, rank_pretrain, argv + ["--grid", "2x1x2x1", "--resume", f"{ck}/step-00000002"])[0][0]
    assert rest["start_step"] == 2
    assert rest["losses"] == pytest.approx(whole[0][0]["losses"][2:], rel=1e-5)
    records = [json.loads(line) for line in open(log)]
    assert records[0]["event"] == "config" and records[0]["model"] == "LlamaForCausalLM"
    assert [r["step"] for r in records if r["event"] == "step"] == [0, 1, 2, 2]


def test_resumed_under_another_ep_gives_the_uninterrupted_loss(ranks, files, tmp_path):
    """A mixture of experts saved under --ep 2 (two replicas of each expert, --zero 1: their AdamW state over the
    two) and resumed under --ep 4 (each rank reading only its expert) goes on with the uninterrupted run's losses."""
    ck = str(tmp_path / "ck")
    argv = ["--config", files["mixtral"], "--data-path", files["corpus"], "--steps", "3", "--grid", "1x1x1x4"] + COMMON
    whole = ranks(4, rank_pretrain, argv + ["--ep", "2", "--zero", "1", "--save", ck, "--save-every", "2"])
    rest = ranks(4, rank_pretrain, argv + ["--ep", "4", "--resume", f"{ck}/step-00000002",
                                           "--allow-config-change", "ep,zero"])[0][0]
    assert rest["start_step"] == 2
    assert rest["losses"] == pytest.approx(whole[0][0]["losses"][2:], rel=1e-5)


@pytest.mark.parametrize("change,msg", [
    ({"config": "nowhere/config.json"}, "--config nowhere/config.json: no readable config.json"),
    ({"config": "{bad}"}, "no model_type field, so it is not a Hugging Face model config"),
    ({"seq": "128"}, "--seq 128 is longer than the model's max_position_embeddings 64"),
    ({"batch": "9"}, "--batch 9 is not divisible by --microbatches 2"),
    ({"data": "text"}, "--data text and --data-path both name the data"),
])
def test_bad_arguments_are_one_line_before_any_rank_starts(files, tmp_path, change, msg):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 32}')
    opts = {"config": files["llama"], "grid": "1x1x1x1", "seq": "16", "data-path": files["corpus"], "batch": "8",
            **change}
    argv = [w for k, v in opts.items() for w in (f"--{k}", v.replace("{bad}", str(bad)))]
    argv += ["--microbatches", "2", "--no-progress"]
    with pytest.raises(SystemExit) as e:
        load_script("train/pretrain.py").main(argv)
    assert msg in str(e.value) and "\n" not in str(e.value)


def rank_main(argv: list) -> dict:
    return load_script("train/pretrain.py").main(argv)


def test_the_shipped_mixture_of_experts_config_learns_the_shipped_text_under_ep(ranks):
    """experiments/configs/mixtral-tiny (8 experts, top-2) from its config on the shipped text (--data text), its
    experts over all 4 d-ranks: the loss falls from ln(256)-ish well below it in 10 steps (the 40-step run of
    docs/results.md at a smaller size)."""
    from helpers import ROOT
    argv = ["--config", str(ROOT / "experiments" / "configs" / "mixtral-tiny"), "--data", "text", "--grid",
            "1x1x1x4", "--ep", "4", "--seq", "32", "--batch", "8", "--steps", "10", "--lr", "3e-3", "--warmup", "2",
            "--no-progress", "--timeout", "60"]
    losses = ranks(4, rank_main, argv)[0]["losses"]
    assert losses[0] > 5.0 and losses[-1] < losses[0] - 1.0, losses
