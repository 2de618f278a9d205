"""Memorization scores of greedy continuations against the true text, over token ids.

A model is prompted with the first P tokens of each training passage and greedy-decodes the next C
(``axgrid.generate``); ``generated [N, C]`` is compared with the passages' true continuations ``reference [N, C]``:

- exact match: the fraction of passages whose C tokens are all right (verbatim reproduction);
- token accuracy: the fraction of the N·C positions that are right (position by position);
- ROUGE-L: per passage the F1 of the longest common subsequence (LCS) of the two token sequences
  (precision LCS/len(generated), recall LCS/len(reference)), averaged over passages.

Why our own LCS: the well-kept package (``rouge-score``) scores strings with its own word tokenizer and
stemmer, so it cannot score the model's token ids (and byte-level ids decode to fragments of words); the LCS
of two short id sequences is a ten-line dynamic programme, so it is written here over the ids themselves.
Rows may be given as a 2-D tensor or as a list of 1-D sequences of different lengths (generation stopped at an
end-of-sequence token); exact match and token accuracy then count a missing token as wrong.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence, Union

import torch

Rows = Union[torch.Tensor, Sequence[Sequence[int]]]


def _rows(x: Rows) -> list[list[int]]:
    if isinstance(x, torch.Tensor):
        if x.dim() != 2:
            raise ValueError(f"expected token ids [N, C], got shape {tuple(x.shape)}")
        return x.tolist()
    return [[int(t) for t in (r.tolist() if isinstance(r, torch.Tensor) else r)] for r in x]


def _pairs(generated: Rows, reference: Rows) -> list[tuple[list[int], list[int]]]:
    g, r = _rows(generated), _rows(reference)
    if len(g) != len(r) or not r:
        raise ValueError(f"{len(g)} generated rows for {len(r)} reference rows: give one continuation per passage "
                         f"(and at least one)")
    if any(not ref for ref in r):
        raise ValueError("a reference continuation is empty: C must be >= 1")
    return list(zip(g, r))


def lcs_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common subsequence of two id sequences (O(len(a)·len(b)) time, O(len(b)) memory)."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def exact_match(generated: Rows, reference: Rows) -> float:
    """Fraction of rows whose generated ids equal the reference ids exactly (same length, every id)."""
    pairs = _pairs(generated, reference)
    return sum(g == r for g, r in pairs) / len(pairs)


def token_accuracy(generated: Rows, reference: Rows) -> float:
    """Fraction of reference positions where the generated id is the reference id (missing ids are wrong)."""
    pairs = _pairs(generated, reference)
    right = sum(sum(a == b for a, b in zip(g, r)) for g, r in pairs)
    return right / sum(len(r) for _, r in pairs)


def rouge_l(generated: Rows, reference: Rows) -> float:
    """Mean over rows of the ROUGE-L F1 = 2·P·R / (P + R), P = LCS/len(generated), R = LCS/len(reference)."""
    pairs = _pairs(generated, reference)
    total = 0.0
    for g, r in pairs:
        n = lcs_length(g, r)
        if n:
            p, rec = n / len(g), n / len(r)
            total += 2 * p * rec / (p + rec)
    return total / len(pairs)


@dataclass(frozen=True)
class MemorizationScore:
    """The three scores of one set of continuations (fractions in [0, 1])."""
    exact_match: float
    token_accuracy: float
    rouge_l: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def score_continuations(generated: Rows, reference: Rows) -> MemorizationScore:
    """Exact match, token accuracy and ROUGE-L of ``generated`` against ``reference`` (see the module doc)."""
    return MemorizationScore(exact_match(generated, reference), token_accuracy(generated, reference),
                             rouge_l(generated, reference))
