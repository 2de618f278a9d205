"""Which tokenizer made a corpus: ``PREFIX.tokenizer.json`` beside ``PREFIX.bin``/``PREFIX.idx``, written by
``python -m axgrid.data preprocess`` and checked by the drivers before step 0. Torch-free.

    write_record("data/corpus", record_of(tokenizer))     # {"name", "vocab_size", "vocab_sha256"}
    read_record("data/corpus")                            # the dict, or None (a corpus without one)
    problem = mismatch("data/corpus", record_of(ckpt_tokenizer), "--checkpoint ckpt")   # one line, or None

The identity of a tokenizer is its vocabulary: the number of ids (``len(tokenizer)``, added tokens included) and
the SHA-256 of its token -> id map (``get_vocab()``, sorted by id, as JSON). Two folders holding the same tokenizer
(a model and its fine-tuned export, two downloads) agree; a tokenizer whose ids mean other tokens does not, even of
the same size. Hashing the map rather than the folder's files keeps the identity independent of which files a
folder happens to hold (``tokenizer.json`` alone, or with ``vocab.json`` and ``merges.txt``) and of the formatting
a ``save_pretrained`` of another transformers version writes. The byte-level tokenizer (``bytes``) is
``{"name": "bytes", "vocab_size": 256, "vocab_sha256": "utf-8 bytes"}``.

The sidecar is a file Megatron does not read: megatron-core opens the ``.bin``/``.idx`` pair as before. A corpus
without it (preprocessed before axgrid recorded tokenizers, or by Megatron's ``preprocess_data.py``) is not
refused: the driver says once that its tokenizer is not checked, and the corpus loader still checks every token id
against the model's vocabulary (:class:`axgrid.data.Corpus`).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

#: The byte-level tokenizer's identity.
BYTES_RECORD = {"name": "bytes", "vocab_size": 256, "vocab_sha256": "utf-8 bytes"}


def record_path(prefix: str | os.PathLike) -> str:
    return f"{prefix}.tokenizer.json"


def record_of(tokenizer: Any, name: Optional[str] = None) -> dict[str, Any]:
    """The identity of a Hugging Face tokenizer (``get_vocab()``, ``len()``), or of ``None`` / a
    :class:`~.tokenizers.ByteTokenizer` (bytes); ``name``: how it was named (a folder)."""
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return dict(BYTES_RECORD)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
    return {"name": name or getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__,
            "vocab_size": len(tokenizer), "vocab_sha256": digest}


def write_record(prefix: str | os.PathLike, record: dict[str, Any]) -> None:
    """Write ``PREFIX.tokenizer.json`` (complete or not at all)."""
    path = record_path(prefix)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)


def read_record(prefix: str | os.PathLike) -> Optional[dict[str, Any]]:
    """The record beside ``PREFIX``, or None when there is none; ValueError (one line) when it is unreadable."""
    path = record_path(prefix)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        return {"name": str(rec["name"]), "vocab_size": int(rec["vocab_size"]),
                "vocab_sha256": str(rec["vocab_sha256"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: unreadable tokenizer record ({e}); preprocess the corpus again") from None


def mismatch(prefix: str, record: Optional[dict[str, Any]], want: dict[str, Any], whose: str) -> Optional[str]:
    """One line when the corpus at ``prefix`` (its ``record``) was made by another tokenizer than ``want`` (the
    tokenizer of ``whose``, e.g. ``--checkpoint DIR``); None when they agree or the corpus has no record."""
    if record is None or (record["vocab_size"], record["vocab_sha256"]) == (want["vocab_size"], want["vocab_sha256"]):
        return None
    return (f"--data-path {prefix} was preprocessed with tokenizer {record['name']} (vocabulary "
            f"{record['vocab_size']:,}), not the tokenizer of {whose} ({want['name']}, vocabulary "
            f"{want['vocab_size']:,}): its ids mean other tokens; preprocess it with --tokenizer {want['name']}, or "
            f"pass --allow-tokenizer-mismatch to train on it anyway")
