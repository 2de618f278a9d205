"""Data for training: tokenizers and batches that every rank builds alike from ``(seed, step)``.

=================  ===================================================================================
:mod:`.tokenizers` :class:`ByteTokenizer` (UTF-8 bytes, vocabulary 256), :func:`load_tokenizer` (a checkpoint
                   folder's own), :func:`encode`
:mod:`.windows`    :class:`TokenWindows` (random windows of a token stream), :class:`TextBatches` (of a text
                   file, byte-level), :class:`SyntheticBatches` (uniform random ids), :func:`spaced_windows`
                   (fixed windows for held-out evaluation)
:mod:`.chat`       conversations for instruction fine-tuning: :func:`read_chat_file` (JSON lines), :func:`load_chat`
                   (chat template, assistant-token mask, rows packed or padded), :class:`ChatRows`
:mod:`.sources`    what a fine-tuning run trains and is scored on: :class:`TextSource`, :class:`ChatSource`
                   (training batches, held-out rows)
instructions/      :data:`KJV_INSTRUCTIONS`: a small instruction set on the shipped text (instructions/README.md)
text/              :data:`DEFAULT_TEXT`: public-domain KJV selections (326 KB, ASCII; text/README.md)
=================  ===================================================================================
"""
from pathlib import Path

from .tokenizers import TOKENIZER_FILES, ByteTokenizer, encode, load_tokenizer
from .windows import SyntheticBatches, TextBatches, TokenWindows, spaced_windows

#: The text the drivers train on by default: selections of the King James Version (public domain).
DEFAULT_TEXT = Path(__file__).resolve().parent / "text" / "kjv_selections.txt"
#: A small instruction set (377 conversations) on that text and common facts (instructions/README.md).
KJV_INSTRUCTIONS = Path(__file__).resolve().parent / "instructions" / "kjv_instructions.jsonl"

__all__ = ["DEFAULT_TEXT", "KJV_INSTRUCTIONS", "TOKENIZER_FILES", "ByteTokenizer", "encode", "load_tokenizer",
           "SyntheticBatches", "TextBatches", "TokenWindows", "spaced_windows"]
