"""Whole-model plans: a transformer whose code we do not own runs on the grid laid out like axgrid's GPT.

    model = transformers.LlamaForCausalLM(config)
    axgrid.parallelize(model, grid)                 # recognised: the built-in Llama plan
    axgrid.parallelize(model, grid, plan=axgrid.plans.hf_plan(model))      # the same, explicitly
    axgrid.parallelize(other, grid, plan=TransformerPlan(...))             # your own model's names
"""
from .hf import HF_FAMILIES, builtin_plan, hf_plan
from .loss import VocabParallelCausalLMLoss
from .transformer import LocalHeadsConfig, Pair, TransformerPlan, apply_plan, gather_logits, resolve

__all__ = ["TransformerPlan", "Pair", "apply_plan", "resolve", "gather_logits", "builtin_plan", "hf_plan",
           "HF_FAMILIES", "LocalHeadsConfig", "VocabParallelCausalLMLoss"]
