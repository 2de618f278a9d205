"""Tied weights survive parallelize (kept dense under drop-in, sharded once under a plan; trained like the dense
model either way); the summary says what stayed dense and why; dense tensors / a dense model / a Hugging Face
export come back from a parallel model; the
state_dict trap paths (another rank's part, a dense state dict, torch.distributed.checkpoint, deepcopy,
save_pretrained) are right or refused clearly."""
from __future__ import annotations

import copy
import io
import os
import warnings

import torch
import torch.distributed as dist
from torch import nn

import axgrid
from axgrid.io.part_copy import part_of_dense


class Proj(nn.Module):
    """A matmul layer that is not nn.Linear (like HF Conv1D): weight [in, out]."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        return x @ self.weight


class TiedToy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.b.weight = self.a.weight              # two Linear layers sharing one weight
        self.proj = Proj(8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight         # lm_head <-> embedding

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.mlp(h)
        h = self.proj(self.b(torch.tanh(self.a(h))))
        return nn.functional.cross_entropy(self.head(h).reshape(-1, 16), ids.reshape(-1))


def _train(model, loss_fn, steps: int, grid=None) -> list[float]:
    """Plain SGD steps (by hand: torch.optim's first step imports torch._dynamo, seconds on a busy machine)."""
    losses = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model)
        loss.backward()
        if grid is not None:
            axgrid.sync_gradients(model, grid)
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
        losses.append(loss.item())
    return losses


def _close(a: dict, b: dict, tol: float = 1e-4) -> list[str]:
    return [k for k in b if not torch.allclose(a[k].float(), b[k].float(), rtol=tol, atol=tol)]


def rank_tied_toy(spec: str, tmp: str) -> dict:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        torch.manual_seed(0)
        dense = TiedToy()
        model = copy.deepcopy(dense)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            axgrid.parallelize(model, grid)
        out = {"tied": model.head.weight is model.emb.weight and model.a.weight is model.b.weight,
               "summary": model.axgrid_summary, "warnings": [str(w.message) for w in caught]}
        ids = torch.randint(0, 16, (3, 5), generator=torch.Generator().manual_seed(1))
        loss = model(ids)
        loss.backward()
        ref = dense(ids)
        ref.backward()
        out["loss"] = (loss.item(), ref.item())
        out["grads_equal"] = all(torch.allclose(getattr(model, m).weight.grad, getattr(dense, m).weight.grad,
                                                rtol=1e-4, atol=1e-6) for m in ("emb", "a", "proj"))
        for m in (model, dense):
            m.zero_grad(set_to_none=True)
        out["losses"] = (_train(model, lambda m: m(ids), 3, grid), _train(dense, lambda m: m(ids), 3))
        want = dense.state_dict()
        out["dense_sd_wrong"] = _close(axgrid.dense_state_dict(model, grid), want)
        back = axgrid.to_dense(model, grid)
        out["to_dense"] = ({type(m) for m in back.modules() if "Linear" in type(m).__name__}, back.head.weight is back.emb.weight, _close(back.state_dict(), want),
            back(ids).item(), dense(ids).item())

        # deepcopy shares the grid and keeps the tiles; the copy computes the same and gathers the same
        twin = copy.deepcopy(model)
        out["deepcopy"] = (twin.mlp[0].grid is grid, twin.mlp[0].weight is not model.mlp[0].weight,
                           twin(ids).item(), model(ids).item(), _close(axgrid.dense_state_dict(twin, grid), want))

        # state_dict: a per-rank round trip through torch.save loads; rank 0's parts on other ranks are refused
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        mine = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
        model.load_state_dict(mine)
        box = [buf.getvalue()]
        dist.broadcast_object_list(box, src=0)
        try:
            model.load_state_dict(torch.load(io.BytesIO(box[0]), weights_only=True))
            out["foreign"] = "loaded"
        except RuntimeError as e:
            out["foreign"] = str(e)
        # a dense state dict loads the right slices
        fresh = copy.deepcopy(TiedToy())
        axgrid.parallelize(fresh, grid)
        fresh.load_state_dict(want)
        out["dense_load"] = (fresh(ids).item(), dense(ids).item())
        # torch.distributed.checkpoint would keep one rank's parts: refused on every rank
        import torch.distributed.checkpoint as dcp
        try:
            dcp.save(model.state_dict(), checkpoint_id=os.path.join(tmp, "dcp"))
            out["dcp"] = "saved"
        except dcp.api.CheckpointException as e:      # (not an Exception subclass)
            out["dcp"] = str(e)
        return out
    finally:
        grid.destroy()


def test_tied_toy_state_dict_and_dense_paths(ranks, tmp_path):
    outs = ranks(4, rank_tied_toy, "2x1x2x1", str(tmp_path))
    for r, o in enumerate(outs):
        assert o["tied"]
        s = o["summary"]
        assert sorted(s.parallel) == ["mlp.0", "mlp.2"]
        assert set(s.dense) == {"a", "b", "head", "proj"}
        assert "tied to emb.weight (Embedding)" in s.dense["head"] and "tied" in s.dense["a"]
        assert "Proj is not nn.Linear" in s.dense["proj"]
        text = " ".join(o["warnings"])
        assert "head left dense: weight is tied" in text and "proj left dense: Proj is not nn.Linear" in text
        assert abs(o["loss"][0] - o["loss"][1]) < 1e-5 and o["grads_equal"]
        par, den = o["losses"]
        assert max(abs(a - b) for a, b in zip(par, den)) < 1e-4 and par[-1] < par[0]
        assert o["dense_sd_wrong"] == []
        kinds, tied, wrong, l1, l2 = o["to_dense"]
        assert kinds == {nn.Linear} and tied and wrong == [] and abs(l1 - l2) < 1e-5
        shares, distinct, l1, l2, wrong = o["deepcopy"]
        assert shares and distinct and abs(l1 - l2) < 1e-6 and wrong == []
        if r == 0:
            assert o["foreign"] == "loaded"
        else:
            assert "part of another rank or grid" in o["foreign"] and "axgrid.checkpoint" in o["foreign"]
        assert abs(o["dense_load"][0] - o["dense_load"][1]) < 1e-5
        assert "torch.distributed.checkpoint would save one rank's part" in o["dcp"] and "axgrid.checkpoint" in o["dcp"]


def rank_hf_tied(spec: str, tmp: str) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    grid = axgrid.init(spec, timeout_s=60)
    try:
        out = {}
        ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(3))
        step = lambda m: m(input_ids=ids, labels=ids).loss  # noqa: E731
        configs = {
            "gpt2": (GPT2LMHeadModel, GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16,
                                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                                 bos_token_id=0, eos_token_id=0)),
            "llama": (LlamaForCausalLM, LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                    num_attention_heads=2, num_key_value_heads=2, vocab_size=32,
                                                    max_position_embeddings=16, tie_word_embeddings=True,
                                                    bos_token_id=0, eos_token_id=0, pad_token_id=0)),
        }
        for name, (cls, cfg) in configs.items():
            torch.manual_seed(0)
            dense = cls(cfg)
            model = copy.deepcopy(dense)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                axgrid.parallelize(model, grid)
            emb = model.get_input_embeddings().weight
            o = {"tied": model.lm_head.weight is emb, "summary": model.axgrid_summary,
                 "warnings": " ".join(str(w.message) for w in caught)}
            loss, ref = step(model), step(dense)
            loss.backward()
            ref.backward()
            o["loss"] = abs(loss.item() - ref.item())
            want = dense.get_input_embeddings().weight.grad
            tile = getattr(emb, "axgrid_tile", None)              # the planned tied Llama: the head's shard
            o["emb_grad"] = float((emb.grad - (want if tile is None else part_of_dense(tile, want))).abs().max())
            model.zero_grad(set_to_none=True)
            dense.zero_grad(set_to_none=True)
            par, den = _train(model, step, 3, grid), _train(dense, step, 3)
            o["train"] = max(abs(a - b) for a, b in zip(par, den))
            o["params_wrong"] = _close(axgrid.dense_state_dict(model, grid), dense.state_dict())
            try:
                model.save_pretrained(os.path.join(tmp, f"{name}-trap"))
                o["save_pretrained"] = "wrote"
            except RuntimeError as e:
                o["save_pretrained"] = str(e)
            o["trap_dir"] = os.path.exists(os.path.join(tmp, f"{name}-trap"))
            where = os.path.join(tmp, name)
            axgrid.export_pretrained(model, where, grid)
            loaded = cls.from_pretrained(where)
            with torch.no_grad():
                logits = model(input_ids=ids).logits
                if hasattr(model, "axgrid_plan"):                     # vocabulary over y, sequences over z
                    logits = axgrid.plans.gather_logits(logits, grid)
                o["export"] = float((loaded(input_ids=ids).logits - logits).abs().max())
            o["export_tied"] = loaded.lm_head.weight is loaded.get_input_embeddings().weight
            out[name] = o
        # untied: the built-in whole-model plan (sharded embedding, norms, vocabulary) exports the same way
        from axgrid.plans import gather_logits
        torch.manual_seed(0)
        cfg = LlamaConfig(**{**configs["llama"][1].to_dict(), "tie_word_embeddings": False})
        model = LlamaForCausalLM(cfg)
        axgrid.parallelize(model, grid)
        where = os.path.join(tmp, "llama-plan")
        axgrid.export_pretrained(model, where, grid)
        loaded = LlamaForCausalLM.from_pretrained(where)
        with torch.no_grad():
            out["plan"] = (len(model.axgrid_summary.parallel), float(
                (loaded(input_ids=ids).logits - gather_logits(model(input_ids=ids).logits, grid)).abs().max()))
        return out
    finally:
        grid.destroy()


def test_hf_tied_gpt2_and_llama_train_like_dense_and_export(ranks, tmp_path):
    outs = ranks(4, rank_hf_tied, "2x2x1x1", str(tmp_path))
    for o in outs:
        g, ll = o["gpt2"], o["llama"]
        assert g["summary"].parallel == [] and "tied to transformer.wte.weight" in g["summary"].dense["lm_head"]
        assert "Conv1D is not nn.Linear" in g["warnings"] and "lm_head left dense: weight is tied" in g["warnings"]
        assert len([n for n, why in g["summary"].dense.items() if "Conv1D" in why]) == 4
        assert ll["summary"].dense == {} and len(ll["summary"].parallel) == 8    # q k v o gate up down, the head
        assert "tied" not in ll["warnings"]                      # the plan keeps it tied, sharded once
        for x in (g, ll):
            assert x["tied"] and x["export_tied"]
            assert x["loss"] < 1e-5 and x["emb_grad"] < 1e-6 and x["train"] < 1e-4 and x["params_wrong"] == []
            assert "axgrid.export_pretrained" in x["save_pretrained"] and not x["trap_dir"]
            assert x["export"] < 1e-5
        assert o["plan"][0] == 8 and o["plan"][1] < 1e-5
