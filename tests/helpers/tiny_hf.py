"""A tiny Hugging Face LLaMA checkpoint written locally (no network): ``save_pretrained`` of a random
``LlamaForCausalLM`` plus, optionally, a byte-level BPE tokenizer trained on the shipped text (``tokenizers``;
:func:`byte_bpe` writes the tokenizer alone)."""
from __future__ import annotations

from axgrid.data import DEFAULT_TEXT

TEXT = str(DEFAULT_TEXT)


def tiny_llama(path: str, vocab: int = 256, tokenizer: bool = False, hidden: int = 32, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, seed: int = 0) -> str:
    """Write a tiny Llama (untied head) to ``path``; with ``tokenizer`` also a ``vocab``-entry byte-level BPE."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path)
    if tokenizer:
        byte_bpe(path, vocab)
    return path


def byte_bpe(path: str, vocab: int) -> str:
    """Write a ``vocab``-entry byte-level BPE tokenizer (``PreTrainedTokenizerFast``) trained on the shipped text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    with open(TEXT, encoding="utf-8") as f:
        tok.train_from_iterator([f.read()[:60000]], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(path)
    return path
