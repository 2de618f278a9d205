"""Data for training: tokenizers, batches, and corpora in Megatron's indexed format.

=================  ===================================================================================
:mod:`.tokenizers` :class:`ByteTokenizer` (UTF-8 bytes, vocabulary 256), :func:`load_tokenizer` (a checkpoint
                   folder's own), :func:`encode`
:mod:`.windows`    :class:`TokenWindows` (random windows of a token stream), :class:`TextBatches` (of a text
                   file, byte-level), :class:`SyntheticBatches` (uniform random ids), :func:`spaced_windows`
                   (fixed windows for held-out evaluation)
:mod:`.indexed`    Megatron's ``.bin``/``.idx`` format: :class:`IndexedWriter`, :class:`IndexedTokens`,
                   :func:`token_dtype`, :class:`DataError` (torch-free)
:mod:`.preprocess` ``python -m axgrid.data preprocess``: JSONL / text to ``.bin``/``.idx`` in worker processes
:mod:`.tokenizer_record` ``PREFIX.tokenizer.json``: which tokenizer made a corpus (name, size, vocabulary hash),
                   written by preprocessing, compared with the model's by the drivers (torch-free)
:mod:`.samples`    :class:`GPTSamples`: seq+1-token samples of one split of one dataset, shuffled per epoch,
                   their index cached next to the data; :func:`parse_split`
:mod:`.blend`      :func:`parse_blend` (``--data-path 0.7 A 0.3 B``), :class:`Blend`: samples of several datasets
:mod:`.corpus`     :class:`Corpus`: the train and validation batches of a blend on the grid (index built by one
                   rank, each rank reads its rows, vocabulary checked, resumable position); :func:`split_tokens`
:mod:`.chat`       conversations for instruction fine-tuning: :func:`~.chat.read_chat_file` (JSON lines),
                   :func:`~.chat.load_chat` (chat template, assistant-token mask, rows packed or padded)
:mod:`.sources`    a fine-tuning run's own data: :class:`~.sources.TextSource`, :class:`~.sources.ChatSource`
                   (training batches and held-out rows)
instructions/      :data:`KJV_INSTRUCTIONS`: a small instruction set on the shipped text (instructions/README.md)
text/              :data:`DEFAULT_TEXT`: public-domain KJV selections (326 KB, ASCII; text/README.md)
=================  ===================================================================================

The names below load on first use (PEP 562), so ``python -m axgrid.data preprocess`` and :mod:`.indexed` run
without importing torch.
"""
import importlib
from pathlib import Path

#: The text the drivers train on by default: selections of the King James Version (public domain).
DEFAULT_TEXT = Path(__file__).resolve().parent / "text" / "kjv_selections.txt"
#: A small instruction set (377 conversations) on that text and common facts (instructions/README.md).
KJV_INSTRUCTIONS = Path(__file__).resolve().parent / "instructions" / "kjv_instructions.jsonl"

_SOURCES = {
    "TOKENIZER_FILES": "tokenizers", "ByteTokenizer": "tokenizers", "encode": "tokenizers",
    "load_tokenizer": "tokenizers",
    "SyntheticBatches": "windows", "TextBatches": "windows", "TokenWindows": "windows", "spaced_windows": "windows",
    "DataError": "indexed", "IndexedTokens": "indexed", "IndexedWriter": "indexed", "token_dtype": "indexed",
    "GPTSamples": "samples", "parse_split": "samples",
    "Blend": "blend", "parse_blend": "blend",
    "Corpus": "corpus", "DataSettings": "corpus", "split_tokens": "corpus",
}

__all__ = ["DEFAULT_TEXT", "KJV_INSTRUCTIONS", *_SOURCES]


def __getattr__(name: str):
    if name not in _SOURCES:
        raise AttributeError(f"module 'axgrid.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_SOURCES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
