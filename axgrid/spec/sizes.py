"""The named GPT sizes: one table, read by the runtime (``GPTConfig.named``), the GEMM tuner and perfmodel.

Layers / hidden / heads are the AxoNN papers' GPT table (SC24, "Democratizing AI"; arXiv 2305.13525). Sequence length and vocabulary are not
given there; the large sizes use seq 2048 and GPT-2/NeoX's ~50,257 tokens padded to 51200. ``gpt-1t`` is the
Megatron-LM 1T shape (~1.01e12 parameters); ``gpt-22b`` (48 / 6144 / 48, ~21.8e9) and ``gpt-175b`` (the GPT-3
shape) are our assumption for the Frontier study's 22B and 175B, whose exact shapes are not held here.
``gpt-405b`` is a GPT of LLaMA-3.1-405B's geometry (126 blocks, hidden 16384, 128 heads, its 128,256-token vocabulary,
8,192-token sequences; ~406e9 parameters with axgrid's 4h MLP instead of LLaMA's SwiGLU 53,248): the AxoNN
paper's 405B fine-tune as far as the GPT can stand in for it (its token table, 128,256 × 16,384 = 2.1e9 elements,
is past 2^31). ``gpt-tiny`` and ``gpt-mini`` are byte-level sizes that run on a laptop CPU with gloo.
"""
from __future__ import annotations

from typing import NamedTuple

#: GPT-2/NeoX's ~50,257 tokens padded to a multiple of 1024 (51200 = 2^11·5^2: divisible by every power-of-two
#: Gy up to 2048, and by 5, 10, 20, ...).
GPT2_PADDED_VOCAB = 51200


class GPTSize(NamedTuple):
    """The sizes that fix a GPT's geometry: ``layers`` blocks of hidden size ``hidden`` with ``heads`` heads,
    at most ``seq`` tokens per sequence, ``vocab`` tokens."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int


NAMED_SIZES: dict[str, GPTSize] = {
    "gpt-tiny": GPTSize(2, 64, 4, 64, 256),
    "gpt-mini": GPTSize(4, 128, 4, 128, 256),
    "gpt-5b": GPTSize(24, 4096, 32, 2048, GPT2_PADDED_VOCAB),
    "gpt-10b": GPTSize(32, 5120, 40, 2048, GPT2_PADDED_VOCAB),
    "gpt-20b": GPTSize(32, 7168, 56, 2048, GPT2_PADDED_VOCAB),
    "gpt-22b": GPTSize(48, 6144, 48, 2048, GPT2_PADDED_VOCAB),
    "gpt-40b": GPTSize(38, 9216, 72, 2048, GPT2_PADDED_VOCAB),
    "gpt-60b": GPTSize(56, 9216, 72, 2048, GPT2_PADDED_VOCAB),
    "gpt-80b": GPTSize(42, 12288, 96, 2048, GPT2_PADDED_VOCAB),
    "gpt-160b": GPTSize(84, 12288, 96, 2048, GPT2_PADDED_VOCAB),
    "gpt-175b": GPTSize(96, 12288, 96, 2048, GPT2_PADDED_VOCAB),
    "gpt-320b": GPTSize(96, 16384, 128, 2048, GPT2_PADDED_VOCAB),
    "gpt-640b": GPTSize(192, 16384, 128, 2048, GPT2_PADDED_VOCAB),
    "gpt-405b": GPTSize(126, 16384, 128, 8192, 128256),
    "gpt-1t": GPTSize(128, 25600, 160, 2048, GPT2_PADDED_VOCAB),
}


def named_size(name: str) -> GPTSize:
    """The sizes of ``name`` (any case); an unknown name raises a ValueError listing the known ones."""
    try:
        return NAMED_SIZES[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown model {name!r}; choose one of the known models: {', '.join(NAMED_SIZES)}") from None
