"""Hugging Face Llama (with and without GQA), Mistral, Qwen2, Qwen3, Gemma 3 (tied) and Phi-3 under their built-in
plans: logits, loss and every gradient equal serial on every grid of 4 ranks and on 2x2x2x1 and 1x2x2x2; AdamW steps
track serial; a model that does not fit the grid raises naming the grids that fit, and one without a plan runs
drop-in with one warning."""
from __future__ import annotations

import warnings

import pytest

from helpers import slow_where
import torch

import axgrid
from axgrid.io.part_copy import part_of_dense
from axgrid.spec.layout import all_shapes

pytest.importorskip("transformers")

SEQ = 8

#: Tiny random-init configurations (no downloads): hidden 32, 2 layers, vocabulary 128.
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=4)),
    "llama-gqa": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4,
                                                            sliding_window=4)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4)),
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4,
                                                             tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4, head_dim=4)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(     # tied; head_dim 8, not hidden/heads = 4
        num_attention_heads=8, num_key_value_heads=4, head_dim=8, sliding_window=4, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention"])),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4, pad_token_id=0,
                                                   bos_token_id=1, eos_token_id=2)),
}


def tiny(kind: str, seed: int = 0, **over) -> torch.nn.Module:
    import transformers
    cfg_name, cls_name, extra = MODELS[kind]
    sizes = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64)
    cfg = getattr(transformers, cfg_name)(**{**sizes, **extra, **over})
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg)
    with torch.no_grad():                        # norms start at 1 (Gemma: 0): random, so each weight is seen
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape))
    return model


def batch(gd: int, b_per_d: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (gd * b_per_d, SEQ), generator=g)
    labels = ids.clone()
    labels[:, :2] = -100                         # ignored labels: the same count in every sequence
    return ids, labels


def serial_step(model, ids, labels, gd: int):
    """Mean over the d slices of the serial loss (what sync_gradients' mean over d computes)."""
    b = ids.shape[0] // gd
    outs = [model(input_ids=ids[i * b:(i + 1) * b], labels=labels[i * b:(i + 1) * b]) for i in range(gd)]
    loss = sum(o.loss for o in outs) / gd
    return loss, [o.logits for o in outs]


def dense_part(param: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``dense`` (a fused tensor's part is several bands of it; a replicated one is all)."""
    tile = getattr(param, "axgrid_tile", None)
    return dense if tile is None else part_of_dense(tile, dense)


def rank_equal_serial(spec: str, kinds: list[str], overlap: bool = False) -> dict:
    ov = axgrid.OverlapConfig(oar=True, ors=True, oag=True, odp=True) if overlap else axgrid.OverlapConfig()
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, overlap=ov, bucket_bytes=4096))
    try:
        gd, gz, d = grid.size("d"), grid.size("z"), grid.index("d")
        worst: dict[str, float] = {}
        for kind in kinds:
            serial, par = tiny(kind), tiny(kind)
            with warnings.catch_warnings():
                warnings.simplefilter("error")             # the built-in plan applies: no fallback warning
                axgrid.parallelize(par, grid)
            assert type(par.model.norm).__name__ == "RMSNorm" and par.axgrid_plan.name == type(par).__name__
            if serial.config.tie_word_embeddings:    # one parameter, read by both; no rank holds it dense
                emb, head = par.model.embed_tokens, par.lm_head
                assert type(emb).__name__ == "TiedEmbedding" and emb.weight is head.weight
                assert head.weight.numel() * grid.size("xyz") < 2 * 128 * 32
            ids, labels = batch(gd, 2 * gz)
            b = ids.shape[0] // gd
            loss_s, logits_s = serial_step(serial, ids, labels, gd)
            loss_s.backward()
            grid.ledger.reset()
            out = par(input_ids=ids[d * b:(d + 1) * b], labels=labels[d * b:(d + 1) * b])
            out.loss.backward()
            axgrid.sync_gradients(par, grid)
            reduced = grid.ledger.entries.get(("d", "all_reduce"))       # each parameter's gradient once over d
            # and one int32 "used" flag per parameter
            assert gd == 1 or reduced.bytes == sum(p.numel() * 4 + 4 for p in par.parameters()), (kind, reduced)
            with torch.no_grad():
                own = serial(input_ids=ids[d * b:(d + 1) * b], labels=labels[d * b:(d + 1) * b]).loss
            errs = [abs(float(out.loss) - float(own))]
            full = axgrid.plans.gather_logits(out.logits.detach(), grid)
            errs.append(float((full - logits_s[d].detach()).abs().max()))
            dense = dict(serial.named_parameters())
            names = [n for n, _ in par.named_parameters()]
            assert sorted(names) == sorted(dense), (sorted(names), sorted(dense))
            for n, p in par.named_parameters():
                want = dense_part(p, dense[n].grad)
                errs.append(float((p.grad - want).abs().max() / (want.abs().max() + 1e-6)))
            worst[kind] = max(errs)
        return worst
    finally:
        grid.destroy()


#: On every grid: the LLaMA family, a tied head among them; the other families on the grids that exercise what they
#: add (q/k norms' gradient over y and z, fused rows over y, Gemma's norms over x), and on the 8-rank grids.
EVERY_GRID = ["llama-tied", "llama-gqa", "mistral", "qwen2"]
FAMILIES = ["qwen3", "gemma3", "phi3"]
FAMILY_GRIDS = ("2x2x1x1", "1x4x1x1", "1x2x2x1")


@pytest.mark.parametrize("spec", slow_where([str(s) for s in all_shapes(4)], lambda s: s != "2x2x1x1"))
def test_every_4_rank_grid_equals_serial(ranks, spec):
    kinds = EVERY_GRID + (FAMILIES if spec in FAMILY_GRIDS else [])
    for worst in ranks(4, rank_equal_serial, spec, kinds):
        assert all(v < 1e-4 for v in worst.values()), worst
        assert sorted(worst) == sorted(kinds)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["2x2x2x1", "1x2x2x2"])
def test_8_rank_grids_equal_serial(ranks, spec):
    for worst in ranks(8, rank_equal_serial, spec, list(MODELS)):
        assert all(v < 1e-4 for v in worst.values()), worst


def test_tied_and_head_norm_gradients_under_every_overlap(ranks):
    """ORS and ODP with a parameter two layers read (the tied weight: both reduce-scatters go back to autograd,
    which adds them before ODP buckets it) and with the head norms' gradients summed over y, then z by the sink."""
    for worst in ranks(4, rank_equal_serial, "1x2x1x2", ["llama-tied", "gemma3"], True):
        assert all(v < 1e-4 for v in worst.values()), worst
    for worst in ranks(4, rank_equal_serial, "1x1x2x2", ["llama-tied"], True):
        assert all(v < 1e-4 for v in worst.values()), worst


def rank_parameter_bytes(spec: str) -> dict:
    """Parameter bytes per rank of a tied model and of its untied twin (each parameter once)."""
    grid = axgrid.init(spec, timeout_s=60)
    try:
        out = {}
        for label, tied in (("tied", True), ("untied", False)):
            model = axgrid.parallelize(tiny("llama-tied", tie_word_embeddings=tied), grid)
            out[label] = sum(p.numel() * p.element_size() for p in model.parameters())
            out[label + " parts"] = {n: p.numel() * p.element_size() for n, p in model.named_parameters()
                                     if n in ("model.embed_tokens.weight", "lm_head.weight")}
        return out
    finally:
        grid.destroy()


@pytest.mark.parametrize("spec", ["1x2x2x1", "4x1x1x1"])
def test_tied_model_holds_its_untied_twin_minus_the_embedding_table(ranks, spec):
    """The tied parameter lives in the head's layout: the twin's [V, h/Gx] table is gone, which is at least the
    head ([V·h/(Gx·Gy·Gz)], equal when Gy·Gz = 1)."""
    for o in ranks(4, rank_parameter_bytes, spec):
        table, head = o["untied parts"]["model.embed_tokens.weight"], o["untied parts"]["lm_head.weight"]
        assert o["tied parts"] == {"model.embed_tokens.weight": head}
        assert o["tied"] == o["untied"] - table, o
        assert o["tied"] <= o["untied"] - head and (o["tied"] == o["untied"] - head) == (spec == "4x1x1x1"), o


def rank_adamw_tracks_serial(spec: str, steps: int) -> list[tuple[float, float]]:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        gd, d = grid.size("d"), grid.index("d")
        serial, par = tiny("llama-gqa"), tiny("llama-gqa")
        axgrid.parallelize(par, grid)
        opt_s = torch.optim.AdamW(serial.parameters(), lr=1e-2)
        opt_p = torch.optim.AdamW(par.parameters(), lr=1e-2)
        losses = []
        for step in range(steps):
            ids, labels = batch(gd, 2 * grid.size("z"), seed=100)
            b = ids.shape[0] // gd
            opt_s.zero_grad()
            loss_s, _ = serial_step(serial, ids, labels, gd)
            loss_s.backward()
            opt_s.step()
            opt_p.zero_grad()
            loss_p = par(input_ids=ids[d * b:(d + 1) * b], labels=labels[d * b:(d + 1) * b]).loss
            loss_p.backward()
            axgrid.sync_gradients(par, grid)
            opt_p.step()
            mean_p = grid.comm.all_reduce(loss_p.detach().reshape(1), "d", average=True)
            losses.append((float(loss_s), float(mean_p)))
        dense = dict(serial.named_parameters())
        worst = max(float((p.detach() - dense_part(p, dense[n].detach())).abs().max())
                    for n, p in par.named_parameters())
        losses.append((worst, 0.0))
        return losses
    finally:
        grid.destroy()


@pytest.mark.slow
def test_twenty_adamw_steps_track_serial(ranks):
    out = ranks(8, rank_adamw_tracks_serial, "2x2x1x2", 20)[0]
    *steps, (worst_param, _) = out
    assert steps[-1][0] < steps[0][0] - 0.5, steps          # it learns
    for serial, par in steps:
        assert abs(serial - par) < 1e-4 * max(1.0, abs(serial)), steps
    assert worst_param < 1e-4


def rank_plan_rules(spec: str) -> dict:
    """A recognised model that does not fit the grid raises (the built-in plan and an explicit one alike), naming
    the grids that fit; plan={} runs it drop-in, equal to serial; a plan that leaves a module with parameters out
    raises; a Hugging Face model without a plan runs drop-in with one warning; a batch that does not split raises."""
    from dataclasses import replace
    from transformers import GPT2Config, GPT2LMHeadModel
    grid = axgrid.init(spec, timeout_s=60)
    try:
        out = {}
        for label, plan in (("builtin", None), ("explicit", "hf")):
            par = tiny("llama", num_key_value_heads=1)
            try:
                axgrid.parallelize(par, grid, plan=axgrid.plans.hf_plan(par) if plan else None)
                out[label] = "no error"
            except ValueError as e:
                out[label] = str(e)
        serial, par = tiny("llama", num_key_value_heads=1), tiny("llama", num_key_value_heads=1)
        axgrid.parallelize(par, grid, plan={})
        ids, labels = batch(1, 2)
        out["drop-in"] = float((par(input_ids=ids, labels=labels).loss
                                - serial(input_ids=ids, labels=labels).loss).abs())
        par = tiny("qwen3")
        try:
            axgrid.parallelize(par, grid, plan=replace(axgrid.plans.hf_plan(par), head_norms=()))
            out["loose"] = "no error"
        except ValueError as e:
            out["loose"] = str(e)
        gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            axgrid.parallelize(gpt2, grid)
        out["unknown"] = [str(w.message) for w in caught if "no built-in plan" in str(w.message)]
        par = tiny("llama")
        axgrid.parallelize(par, grid)
        try:
            par(input_ids=torch.zeros(3, SEQ, dtype=torch.long))
            out["batch"] = "no error"
        except ValueError as e:
            out["batch"] = str(e)
        return out
    finally:
        grid.destroy()


def test_a_model_that_does_not_fit_raises_naming_the_grids_that_fit(ranks):
    fit = "grids of 4 ranks that fit: 1x1x1x4, 1x1x2x2, 1x1x4x1, 2x1x1x2, 2x1x2x1, 4x1x1x1 (or plan={}: drop-in)"
    for o in ranks(4, rank_plan_rules, "1x2x2x1"):
        for label in ("builtin", "explicit"):
            msg = o[label]
            assert "k_proj head count" in msg and "=1 is not divisible by Gy=2" in msg and fit in msg, msg
            assert "Gy must divide 1" in msg and "\n" not in msg, msg
        assert o["drop-in"] < 1e-5
        assert "q_norm" in o["loose"] and "hold parameters the plan does not place" in o["loose"], o["loose"]
        assert len(o["unknown"]) == 1 and "GPT2LMHeadModel has no built-in plan and runs drop-in" in o["unknown"][0]
        assert "divide over Gz=2" in o["batch"], o["batch"]


def rank_compiled_equals_eager(spec: str, layers: int) -> dict:
    """torch.compile (AOTAutograd, the aot_eager backend: inductor's code generation is minutes on this CPU) of
    the planned model: graph breaks counted, loss, gradients and the ledger equal to eager."""
    import torch._dynamo as dynamo
    grid = axgrid.init(spec, timeout_s=120)
    try:
        eager, par = tiny("llama-gqa", num_hidden_layers=layers), tiny("llama-gqa", num_hidden_layers=layers)
        axgrid.parallelize(eager, grid)
        axgrid.parallelize(par, grid)
        ids, labels = batch(grid.size("d"), 2 * grid.size("z"))
        dynamo.reset()
        dynamo.utils.counters.clear()
        compiled = torch.compile(par, backend="aot_eager")
        out = {}
        for name, model, step in (("eager", eager, eager), ("compiled", par, compiled)):
            model.zero_grad(set_to_none=True)
            grid.ledger.reset()
            loss = step(input_ids=ids, labels=labels).loss
            loss.backward()
            axgrid.sync_gradients(model, grid)
            out[name] = (float(loss.detach()), {k: (e.calls, e.bytes) for k, e in grid.ledger.entries.items()},
                         {n: p.grad for n, p in model.named_parameters()})
        out["breaks"] = sum(dynamo.utils.counters["graph_break"].values())
        out["reasons"] = list(dynamo.utils.counters["graph_break"])[:5]
        out["grad_err"] = max(float((out["compiled"][2][n] - g).abs().max()) for n, g in out["eager"][2].items())
        for name in ("eager", "compiled"):
            out[name] = out[name][:2]
        return out
    finally:
        grid.destroy()


@pytest.mark.slow
def test_compiled_model_has_few_graph_breaks_and_counts_its_collectives(ranks):
    """Slow part on CPU (compilation): one layer, one grid, the aot_eager backend."""
    for o in ranks(4, rank_compiled_equals_eager, "1x2x2x1", 1):
        assert o["breaks"] <= 5, o["reasons"]
        assert abs(o["eager"][0] - o["compiled"][0]) < 1e-5 and o["grad_err"] < 1e-5, o
        # the compiled backward reuses the forward's gathered weight blocks (as keep_gathered_weights does), so the
        # weight all-gathers over z are the forward's alone; every other collective is the same
        eager, compiled = dict(o["eager"][1]), dict(o["compiled"][1])
        calls, nbytes = eager.pop(("z", "all_gather"))
        assert compiled.pop(("z", "all_gather")) == (calls // 2, nbytes // 2)
        assert eager == compiled and eager, (eager, compiled)


class SwiGLU(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def rank_two_producers(spec: str) -> dict:
    """pair(["gate", "up"], "down") on a model parallelize does not know: equal to serial, no redistribution
    between the three layers (the gate/up outputs stay sharded)."""
    grid = axgrid.init(spec, timeout_s=60)
    try:
        torch.manual_seed(0)
        serial, par = SwiGLU(), SwiGLU()
        par.load_state_dict(serial.state_dict())
        axgrid.parallelize(par, grid, plan=axgrid.pair(["gate", "up"], "down"))
        x = torch.randn(3, 5, 8)                           # 15 tokens: uneven over Gz=2
        y = par(x)
        y.pow(2).sum().backward()
        serial(x).pow(2).sum().backward()
        errs = [float((y - serial(x)).abs().max())]
        for n, p in par.named_parameters():
            errs.append(float((p.grad - dense_part(p, dict(serial.named_parameters())[n].grad)).abs().max()))
        layouts = {n: (m.input_layout, m.output_layout) for n, m in par.named_children()}
        try:
            axgrid.parallelize(SwiGLU(), grid, plan={**axgrid.pair(["gate", "up"], "down"), "up": axgrid.LinearPlan()})
            bad = "no error"
        except ValueError as e:
            bad = str(e)
        return {"err": max(errs), "layouts": layouts, "bad": bad}
    finally:
        grid.destroy()


def test_several_producers_for_one_consumer(ranks):
    for o in ranks(4, rank_two_producers, "1x2x2x1"):
        assert o["err"] < 1e-5, o
        assert o["layouts"] == {"gate": ("replicated", "sharded"), "up": ("replicated", "sharded"),
                                "down": ("sharded", "replicated")}
        assert "the producer must have a sharded output" in o["bad"], o["bad"]
