"""A tiny Hugging Face LLaMA checkpoint written locally (no network): ``save_pretrained`` of a random
``LlamaForCausalLM`` plus, optionally, a byte-level BPE tokenizer trained on the shipped text (``tokenizers``;
:func:`byte_bpe` writes the tokenizer alone), with ChatML's special tokens and chat template when asked."""
from __future__ import annotations

from axgrid.data import DEFAULT_TEXT

TEXT = str(DEFAULT_TEXT)
#: ChatML, the template SmolLM2 and Qwen use (without a default system turn)
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def tiny_llama(path: str, vocab: int = 256, tokenizer: bool = False, hidden: int = 32, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, seed: int = 0, chat: bool = False) -> str:
    """Write a tiny Llama (untied head) to ``path``; with ``tokenizer`` also a ``vocab``-entry byte-level BPE (a
    ChatML one with ``chat``: :func:`byte_bpe`)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path)
    if tokenizer:
        byte_bpe(path, vocab, chat)
    return path


def byte_bpe(path: str, vocab: int, chat: bool = False) -> str:
    """Write a ``vocab``-entry byte-level BPE tokenizer (``PreTrainedTokenizerFast``) trained on the shipped text;
    with ``chat`` its first two ids are ``<|im_start|>`` and ``<|im_end|>`` (also eos and pad) and it carries
    :data:`CHATML`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|im_start|>", "<|im_end|>"] if chat else []
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=special, show_progress=False)
    with open(TEXT, encoding="utf-8") as f:
        tok.train_from_iterator([f.read()[:60000]], trainer)
    extra = dict(eos_token="<|im_end|>", pad_token="<|im_end|>", chat_template=CHATML) if chat else {}
    PreTrainedTokenizerFast(tokenizer_object=tok, **extra).save_pretrained(path)
    return path
