"""Small corpora for the data tests, written locally: the shipped KJV text as JSON lines (one chapter per line), and
indexed datasets of random documents."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from axgrid.data import DEFAULT_TEXT


def kjv_chapters() -> list[str]:
    """The shipped text's chapters (heading and paragraph): 101 documents."""
    paras = [p for p in DEFAULT_TEXT.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return [paras[i] + "\n\n" + paras[i + 1] for i in range(0, len(paras) - 1, 2)]


def write_jsonl(path: str | Path, docs: list[str], key: str = "text") -> str:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({key: d}) + "\n")
    return str(path)


def random_dataset(prefix: str | Path, docs: int = 120, vocab: int = 300, max_len: int = 60, seed: int = 0,
                   sequences_per_doc: int = 1) -> list[np.ndarray]:
    """An indexed dataset of ``docs`` random documents (lengths 0..max_len, some empty); returns each document's
    tokens."""
    from axgrid.data.indexed import IndexedWriter, token_dtype
    rng = np.random.default_rng(seed)
    out = []
    with IndexedWriter(prefix, token_dtype(vocab)) as w:
        for _ in range(docs):
            parts = [rng.integers(0, vocab, int(rng.integers(0, max_len))) for _ in range(sequences_per_doc)]
            for p in parts:
                w.add(p)
            w.end_document()
            out.append(np.concatenate(parts))
    return out
