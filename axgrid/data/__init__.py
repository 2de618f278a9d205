"""Data for training: tokenizers and batches that every rank builds alike from ``(seed, step)``.

=================  ===================================================================================
:mod:`.tokenizers` :class:`ByteTokenizer` (UTF-8 bytes, vocabulary 256), :func:`load_tokenizer` (a checkpoint
                   folder's own), :func:`encode`
:mod:`.windows`    :class:`TokenWindows` (random windows of a token stream), :class:`TextBatches` (of a text
                   file, byte-level), :class:`SyntheticBatches` (uniform random ids)
text/              :data:`DEFAULT_TEXT`: public-domain KJV selections (326 KB, ASCII; text/README.md)
=================  ===================================================================================
"""
from pathlib import Path

from .tokenizers import TOKENIZER_FILES, ByteTokenizer, encode, load_tokenizer
from .windows import SyntheticBatches, TextBatches, TokenWindows

#: The text the drivers train on by default: selections of the King James Version (public domain).
DEFAULT_TEXT = Path(__file__).resolve().parent / "text" / "kjv_selections.txt"

__all__ = ["DEFAULT_TEXT", "TOKENIZER_FILES", "ByteTokenizer", "encode", "load_tokenizer", "SyntheticBatches",
           "TextBatches", "TokenWindows"]
