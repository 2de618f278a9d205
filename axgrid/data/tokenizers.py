"""Text to token ids: a byte-level tokenizer, or a checkpoint folder's own (Hugging Face ``AutoTokenizer``).

    tok = load_tokenizer("path/to/hf_folder")     # None when the folder holds no tokenizer
    ids = encode(text, tok)                       # [T] int64: the tokenizer's ids, or UTF-8 bytes without one
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch

#: Files of which at least one is in a folder that holds a Hugging Face tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class ByteTokenizer:
    """Byte-level tokenizer: UTF-8 bytes are the token ids (vocabulary 256), decoding replaces invalid bytes."""

    vocab_size = 256

    def encode(self, text: str) -> torch.Tensor:
        """``[len(text.encode())]`` int64 ids."""
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def load_tokenizer(path: str | Path) -> Optional[Any]:
    """The checkpoint folder's own tokenizer (``AutoTokenizer``, local files only), or None when it has none."""
    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def encode(text: str, tokenizer: Optional[Any]) -> torch.Tensor:
    """``text`` as token ids ``[T]`` int64: the tokenizer's (no special tokens added), or UTF-8 bytes without one."""
    if tokenizer is None:
        return ByteTokenizer().encode(text)
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
