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



def _decoder(name: str, family: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
             seq: int, **extra) -> TransformerShape:
    return TransformerShape(name, layers, hidden, heads, seq, vocab, bias=False, ffn=ffn, family=family,
                            kv_heads=kv_heads, **extra)


#: name -> the shape of a public model, read from its published config.json (Hugging Face hub), at the sequence
#: length it was pre-trained with (Llama 3.1: 8,192 before its long-context stage; Mistral 7B v0.3, Qwen2.5:
#: their configs' pre-training length 32,768 is long for ranking, so 4,096 / 8,192 as their reports' main stage).
#: A config.json gives the same shape (``TransformerShape.from_config_json``); tests/unit check that.
PUBLIC_MODELS: dict[str, TransformerShape] = {shape.name: shape for shape in (
    _decoder("llama-3.1-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 8192),
    _decoder("llama-3.1-70b", "llama", 80, 8192, 64, 8, 28672, 128256, 8192),
    _decoder("llama-3.1-405b", "llama", 126, 16384, 128, 8, 53248, 128256, 8192),
    _decoder("llama-2-7b", "llama", 32, 4096, 32, 32, 11008, 32000, 4096),
    _decoder("llama-2-13b", "llama", 40, 5120, 40, 40, 13824, 32000, 4096),
    _decoder("llama-2-70b", "llama", 80, 8192, 64, 8, 28672, 32000, 4096),
    _decoder("mistral-7b", "mistral", 32, 4096, 32, 8, 14336, 32768, 4096),
    _decoder("qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, 4096, attention_bias=True),
    _decoder("qwen2.5-32b", "qwen2", 64, 5120, 40, 8, 27648, 152064, 4096, attention_bias=True),
    # Qwen3 (Qwen/Qwen3-8B, Qwen/Qwen3-32B config.json: head_dim 128, q/k norms, untied, use_sliding_window false;
    # 4,096 tokens: the Qwen3 technical report's general pre-training stage S1)
    _decoder("qwen3-8b", "qwen3", 36, 4096, 32, 8, 12288, 151936, 4096, head_dim=128, head_norms=True),
    _decoder("qwen3-32b", "qwen3", 64, 5120, 64, 8, 25600, 151936, 4096, head_dim=128, head_norms=True),
    # Gemma 3's text decoder (google/gemma-3-12b-it, google/gemma-3-27b-it config.json's text_config; what it leaves
    # out is Gemma3TextConfig's default: vocabulary 262,208, head_dim 256 for 12B, tied, 5 local layers in 6 with a
    # 1,024-token window; 8,192 tokens: its pre-training's 32K is long for ranking)
    _decoder("gemma-3-12b", "gemma3_text", 48, 3840, 16, 8, 15360, 262208, 8192, head_dim=256, tied=True,
             head_norms=True, sliding_window=1024, sliding_layers=40),
    _decoder("gemma-3-27b", "gemma3_text", 62, 5376, 32, 16, 21504, 262208, 8192, head_dim=128, tied=True,
             head_norms=True, sliding_window=1024, sliding_layers=52),
    # Phi-3 (microsoft/Phi-3-mini-4k-instruct, microsoft/Phi-3-medium-4k-instruct config.json: fused qkv and
    # gate_up, untied, a 2,047-token window on every layer, 4,096-token context)
    _decoder("phi-3-mini", "phi3", 32, 3072, 32, 32, 8192, 32064, 4096, sliding_window=2047, sliding_layers=32),
    _decoder("phi-3-medium", "phi3", 40, 5120, 40, 10, 17920, 32064, 4096, sliding_window=2047, sliding_layers=40),
    # mixtures of experts, at their pre-training's main sequence length:
    # Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1 config.json: 8 local experts of 14,336, 2 per token, no sliding
    # window, untied; ~46.7e9 parameters, ~12.9e9 active)
    _decoder("mixtral-8x7b", "mixtral", 32, 4096, 32, 8, 14336, 32000, 4096, experts=8, top_k=2, expert_ffn=14336,
             norm_topk_prob=True),
    # Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json: 128 experts of 768, 8 per token, norm_topk_prob true,
    # decoder_sparse_step 1, no mlp_only_layers, head_dim 128, q/k norms, untied; ~30.5e9 parameters, ~3.3e9 active)
    _decoder("qwen3-30b-a3b", "qwen3_moe", 48, 2048, 32, 4, 6144, 151936, 4096, head_dim=128, head_norms=True,
             experts=128, top_k=8, expert_ffn=768, norm_topk_prob=True),
    # OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924 config.json: 64 experts of 1,024, 8 per token, norm_topk_prob false,
    # q/k norms over the whole q and k widths, untied, 4,096-token context; ~6.9e9 parameters, ~1.3e9 active)
    _decoder("olmoe-1b-7b", "olmoe", 16, 2048, 16, 16, 1024, 50304, 4096, head_norms=True, experts=64, top_k=8,
             expert_ffn=1024),
)}
