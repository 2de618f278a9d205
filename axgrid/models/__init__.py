"""Models built from axgrid layers."""
from ..spec import gpt_flops_per_iteration, gpt_parameters
from .gpt import GPT, GPTConfig
from .kv_cache import KVCache
from .mlp import MLPStack

__all__ = ["MLPStack", "GPT", "GPTConfig", "KVCache", "gpt_flops_per_iteration", "gpt_parameters"]
