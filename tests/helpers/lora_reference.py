"""LoRA on a parallelized Hugging Face model against PEFT on the serial one -- a reference we did not write.

On each rank: a tiny random transformers model twice, one wrapped by ``peft.get_peft_model`` (random A and B:
``init_lora_weights=False``, so every gradient is non-zero), one parallelized by axgrid with ``axgrid.lora`` and the
same adapter tensors loaded through PEFT's names (:func:`axgrid.adapters.peft_format.load_adapter_tensors`). Both
take two SGD steps on the same global batch (the serial loss is the mean over the d slices, as axgrid's mean over d);
:func:`lora_differences` returns the worst relative differences of the loss, the logits and each step's update of
every adapter parameter (lr · its gradient, relative to the step's largest update), plus what the ledger saw."""
from __future__ import annotations

from dataclasses import dataclass

import torch

SEQ, VOCAB, LR, STEPS, R, ALPHA = 8, 128, 0.1, 2, 4, 8.0

#: Tiny random-init configurations (hidden 32, 2 layers): untied and tied Llama, Qwen3 (q/k norms), Phi-3 (fused)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=4)),
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4,
                                                             tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4, head_dim=4)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4, pad_token_id=0,
                                                   bos_token_id=1, eos_token_id=2)),
}
#: every projection of the blocks (Phi-3's fused ones: one adapter over the whole fused output, as PEFT's)
TARGETS = {"phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Case:
    kind: str
    grid: str
    overlap: str = "none"
    zero: int = 0
    seed: int = 0


def tiny(kind: str, seed: int = 0) -> torch.nn.Module:
    import transformers
    cfg_name, cls_name, extra = MODELS[kind]
    cfg = getattr(transformers, cfg_name)(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, max_position_embeddings=64, **extra)
    torch.manual_seed(seed)
    return getattr(transformers, cls_name)(cfg)


def peft_model(kind: str, seed: int = 0, r: int = R, alpha: float = ALPHA):
    """The serial model with PEFT's LoRA on every projection, A and B random."""
    import peft
    torch.manual_seed(seed + 1)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets(kind)),
                          init_lora_weights=False, bias="none")
    return peft.get_peft_model(tiny(kind, seed), cfg)


def targets(kind: str) -> tuple[str, ...]:
    return TARGETS.get(kind, LLAMA_TARGETS)


def peft_adapter_tensors(model) -> dict[str, torch.Tensor]:
    """PEFT's adapter tensors under the names of its saved file."""
    from peft import get_peft_model_state_dict
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def batch(gd: int, b_per_d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 7)
    ids = torch.randint(0, VOCAB, (gd * b_per_d, SEQ), generator=g)
    labels = ids.clone()
    labels[:, :2] = -100
    return ids, labels


def lora_differences(case: Case) -> dict:
    """On one rank: train ``case`` under PEFT (serial) and under axgrid; the worst differences and ledger facts."""
    import axgrid
    from axgrid.adapters.peft_format import load_adapter_tensors
    from axgrid.io.part_copy import part_of_dense
    torch.set_num_threads(1)
    config = axgrid.RuntimeConfig(timeout_s=60, overlap=axgrid.OverlapConfig.parse(case.overlap), zero=case.zero,
                                  bucket_bytes=2048, seed=0)
    grid = axgrid.init(case.grid, config=config)
    try:
        gd, gz, d = grid.size("d"), grid.size("z"), grid.index("d")
        ref = peft_model(case.kind, case.seed)
        dense = peft_adapter_tensors(ref)
        par = axgrid.parallelize(tiny(case.kind, case.seed), grid)
        axgrid.lora(par, grid, r=R, alpha=ALPHA, targets=targets(case.kind))
        load_adapter_tensors(par, {k: tuple(v.shape) for k, v in dense.items()}, "PEFT", lambda k, box: dense[k][box.slices()])
        trained = {n: p for n, p in par.named_parameters() if p.requires_grad}
        assert trained and all(".lora." in n for n in trained), sorted(trained)
        peft_of = {n: "base_model.model." + n.replace(".lora.A", ".lora_A.default.weight")
                   .replace(".lora.B", ".lora_B.default.weight") for n in trained}
        ref_params = dict(ref.named_parameters())
        grid.watch(par)
        opt_s = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=LR)
        opt_p = axgrid.shard_optimizer(torch.optim.SGD(list(trained.values()), lr=LR), par, grid)
        worst = {"loss": 0.0, "logits": 0.0, "update": 0.0, "param": 0.0}
        facts = {"rs_z": 0, "frozen_grads": 0, "d_bytes": 0}
        for step in range(STEPS):
            ids, labels = batch(gd, 2 * gz, case.seed * 100 + step)
            b = ids.shape[0] // gd
            before_s = {n: ref_params[peft_of[n]].detach().clone() for n in trained}
            before_p = {n: p.detach().clone() for n, p in trained.items()}
            opt_s.zero_grad()
            outs = [ref(input_ids=ids[i * b:(i + 1) * b], labels=labels[i * b:(i + 1) * b]) for i in range(gd)]
            (sum(o.loss for o in outs) / gd).backward()
            opt_s.step()
            opt_p.zero_grad()
            grid.ledger.reset()
            out = par(input_ids=ids[d * b:(d + 1) * b], labels=labels[d * b:(d + 1) * b])
            out.loss.backward()
            opt_p.step()
            axgrid.finish_gradients(grid)
            led = grid.ledger.entries
            facts["rs_z"] += led[("z", "reduce_scatter")].count if ("z", "reduce_scatter") in led else 0
            facts["d_bytes"] = max(facts["d_bytes"], sum(e.bytes for (dim, _), e in led.items() if dim == "d"))
            facts["frozen_grads"] += sum(p.grad is not None for p in par.parameters() if not p.requires_grad)
            full = axgrid.plans.gather_logits(out.logits.detach(), grid)
            worst["loss"] = max(worst["loss"], abs(float(out.loss.detach()) - float(outs[d].loss.detach())))
            worst["logits"] = max(worst["logits"], float((full - outs[d].logits.detach()).abs().max()))
            # each update against the step's largest (a tensor whose gradient is 50x smaller than the rest is still
            # checked to 2e-3 of its own size; per tensor, fp32 rounding of ``before - after`` would dominate)
            pairs = [(before_p[n] - p.detach(), part_of_dense(p.axgrid_tile, before_s[n] - ref_params[peft_of[n]].detach()))
                     for n, p in trained.items()]
            scale = max(float(w.abs().max()) for _, w in pairs) + 1e-6
            worst["update"] = max(worst["update"], max(float((g - w).abs().max()) for g, w in pairs) / scale)
            for n, p in trained.items():
                now = part_of_dense(p.axgrid_tile, ref_params[peft_of[n]].detach())
                worst["param"] = max(worst["param"], float((p.detach() - now).abs().max()))
        facts["trained_bytes"] = sum(p.numel() * 4 for p in trained.values())
        return {"worst": worst, **facts}
    finally:
        grid.destroy()


def peft_format_round_trip(spec: str, root: str, kind: str = "phi3") -> dict:
    """PEFT's format both ways and the merge: the worst logit difference from PEFT's serial model of (a) the PEFT
    adapter loaded by axgrid, (b) axgrid's saved adapter loaded by ``PeftModel.from_pretrained`` (every rank
    checks), (c) the merged parallel model, (d) its ``export_pretrained`` loaded by transformers."""
    import os
    import peft
    import transformers
    import axgrid
    torch.set_num_threads(1)
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60))   # Gd = 1: every rank sees the batch
    try:
        ids = batch(1, 2 * grid.size("z"), 3)[0]
        ref = peft_model(kind).eval()
        with torch.no_grad():
            want = ref(input_ids=ids).logits
        src, ours, merged = (os.path.join(root, n) for n in ("peft", "axgrid", "merged"))
        if grid.rank == 0:
            ref.save_pretrained(src)
        axgrid.io.agree(grid, [0])                     # (a barrier) the files are written
        par = axgrid.parallelize(tiny(kind), grid).eval()
        axgrid.load_adapter(par, src, grid)

        def logits() -> float:
            with torch.no_grad():
                got = axgrid.plans.gather_logits(par(input_ids=ids).logits, grid)
            return float((got - want).abs().max())

        out = {"loaded": logits()}
        axgrid.save_adapter(par, ours, grid)
        back = peft.PeftModel.from_pretrained(tiny(kind), ours).eval()
        with torch.no_grad():
            out["peft_loads_ours"] = float((back(input_ids=ids).logits - want).abs().max())
        out["files"] = sorted(os.listdir(ours))
        axgrid.merge_lora(par)
        out["merged"] = logits()
        out["trainable_after_merge"] = sum(p.requires_grad for p in par.parameters())
        axgrid.export_pretrained(par, merged, grid)
        dense = getattr(transformers, MODELS[kind][1]).from_pretrained(merged).eval()
        with torch.no_grad():
            out["exported"] = float((dense(input_ids=ids).logits - want).abs().max())
        return out
    finally:
        grid.destroy()


def bad_inputs(spec: str, root: str) -> list[str]:
    """The one-line errors of bad LoRA input, as each rank raised them (none posts a collective first)."""
    import os
    import axgrid
    torch.set_num_threads(1)
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60))
    msgs = []
    try:
        calls = [lambda m: axgrid.lora(m, grid, r=4, targets=["q_proj", "qq_proj"]),
                 lambda m: axgrid.lora(m, grid, r=0, targets=["q_proj"]),
                 lambda m: axgrid.load_adapter(m, os.path.join(root, "llama"), grid),      # k_proj B is [32, 4]
                 lambda m: axgrid.load_adapter(m, os.path.join(root, "phi3"), grid)]       # qkv_proj: not here
        if grid.rank == 0:
            for kind in ("llama", "phi3"):
                peft_model(kind).save_pretrained(os.path.join(root, kind))
        axgrid.io.agree(grid, [0])
        for call in calls:
            m = axgrid.parallelize(tiny("llama-tied"), grid)
            before = grid.ledger.snapshot()
            try:
                call(m)
                msgs.append("no error")
            except ValueError as e:
                msgs.append(str(e))
            assert grid.ledger.snapshot() == before, "a collective was posted before the error"
            assert all(p.requires_grad for p in m.parameters()) and getattr(m, "axgrid_lora", None) is None
        return msgs
    finally:
        grid.destroy()


def checkpoint_adapters(spec: str, root: str, save: bool) -> dict:
    """Save (``save``) or load a checkpoint of a LoRA model with AdamW state: the adapters are trained a step with
    a fixed seed, so the loading grid can rebuild what the saving one held and compare (its dense adapters)."""
    import os
    import axgrid
    torch.set_num_threads(1)
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, zero=1 if grid_d(spec) > 1 else 0))
    try:
        par = axgrid.parallelize(tiny("llama"), grid)
        axgrid.lora(par, grid, r=R, alpha=ALPHA, targets=["q_proj", "down_proj"])
        trained = [p for p in par.parameters() if p.requires_grad]
        grid.watch(par)
        opt = axgrid.shard_optimizer(torch.optim.AdamW(trained, lr=1e-2), par, grid)
        names = [n for n, p in par.named_parameters() if p.requires_grad]
        if save:
            ids, labels = batch(grid.size("d"), 2 * grid.size("z"), 5)
            b = ids.shape[0] // grid.size("d")
            d = grid.index("d")
            par(input_ids=ids[d * b:(d + 1) * b], labels=labels[d * b:(d + 1) * b]).loss.backward()
            opt.step()
            axgrid.checkpoint.save_checkpoint(root, par, opt, grid, step=1)
        else:
            axgrid.checkpoint.load_checkpoint(root, par, opt, grid)
        axgrid.finish_gradients(grid)
        dense = axgrid.dense_state_dict(par, grid)
        import json
        with open(os.path.join(root, "step-00000001", "manifest.json"), encoding="utf-8") as f:
            held = sorted(json.load(f)["tensors"])
        return {"adapters": {n: dense[n] for n in names}, "held": held}
    finally:
        grid.destroy()


def grid_d(spec: str) -> int:
    return int(spec.split("x")[3])


def dropout_replicas(spec: str, shared_mask: bool = True) -> dict:
    """Two SGD steps with adapter dropout 0.5 on ``spec``: the replicas of every adapter parameter stay equal
    (``axgrid.check_replicas``) -- the ranks that share a layer input draw the same mask -- and the steps are not the
    dropout-free ones. ``shared_mask=False`` seeds the global RNG per rank (what a mismatched mask would do)."""
    import axgrid
    torch.set_num_threads(1)
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60))
    try:
        out = {}
        for p_drop in (0.0, 0.5):
            par = axgrid.parallelize(tiny("llama"), grid)
            torch.manual_seed(0 if shared_mask else grid.rank)      # after tiny(), which seeds the RNG itself
            axgrid.lora(par, grid, r=R, alpha=ALPHA, targets=LLAMA_TARGETS, dropout=p_drop)
            with torch.no_grad():
                for n, p in par.named_parameters():
                    if n.endswith("lora.B"):
                        p.fill_(0.1)          # non-zero, so that A's gradient depends on the masks
            opt = torch.optim.SGD([p for p in par.parameters() if p.requires_grad], lr=1.0)
            for step in range(2):
                ids, labels = batch(grid.size("d"), 2 * grid.size("z"), step)
                opt.zero_grad()
                par(input_ids=ids, labels=labels).loss.backward()
                opt.step()
            out[p_drop] = {n: p.detach().clone() for n, p in par.named_parameters() if p.requires_grad}
            out[f"drifted {p_drop}"] = axgrid.check_replicas(par, grid, repair=False)
        out["changed"] = max(float((out[0.5][n] - out[0.0][n]).abs().max()) for n in out[0.0])
        return {k: v for k, v in out.items() if isinstance(k, str)}
    finally:
        grid.destroy()
