"""The named GPT sizes: one table of :class:`~axgrid.spec.shape.TransformerShape` (``TransformerShape.named``),
read by the runtime (``GPTConfig.named``), the GEMM tuner and perfmodel.

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

from .shape import GPT2_PADDED_VOCAB, TransformerShape


#: name -> the GPT of that size (layers, hidden, heads, seq, vocab)
NAMED_SIZES: dict[str, TransformerShape] = {shape.name: shape for shape in (
    TransformerShape("gpt-tiny", 2, 64, 4, 64, 256),
    TransformerShape("gpt-mini", 4, 128, 4, 128, 256),
    TransformerShape("gpt-5b", 24, 4096, 32, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-10b", 32, 5120, 40, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-20b", 32, 7168, 56, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-22b", 48, 6144, 48, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-40b", 38, 9216, 72, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-60b", 56, 9216, 72, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-80b", 42, 12288, 96, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-160b", 84, 12288, 96, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-175b", 96, 12288, 96, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-320b", 96, 16384, 128, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-640b", 192, 16384, 128, 2048, GPT2_PADDED_VOCAB),
    TransformerShape("gpt-405b", 126, 16384, 128, 8192, 128256),
    TransformerShape("gpt-1t", 128, 25600, 160, 2048, GPT2_PADDED_VOCAB),
)}

