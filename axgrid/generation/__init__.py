"""Autoregressive generation on a parallel model: ``axgrid.generate(model, input_ids, grid, max_new_tokens)``.

    grid = axgrid.init("2x2x1x1")
    model = axgrid.models.GPT(config, grid)        # or axgrid.parallelize(LlamaForCausalLM(...), grid)
    out = axgrid.generate(model, prompts, grid, 32)     # greedy, [B, S + n] on every rank, n <= 32: stops at the
                                                         # model's EOS (its generation_config's), as transformers
    out = axgrid.generate(model, prompts, grid, 32, temperature=0.8, top_k=50, eos_token_id=2, seed=1)

``loop`` holds the loop, ``decoders`` one step of each supported model (and its key/value cache), ``select``
the vocabulary-parallel argmax, top-k and sampling; ``special`` the EOS and pad ids the model's configuration
gives when the call gives none; ``pad`` pads a batch that does not split over the grid.
"""
from .pad import generate

__all__ = ["generate"]
