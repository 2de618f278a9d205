"""Blends of datasets in Megatron's syntax, and the blended order of samples.

    parse_blend(["0.7", "data/a", "0.3", "data/b"])    # [(0.7, "data/a"), (0.3, "data/b")]
    parse_blend(["data/a", "data/b"])                  # [(None, "data/a"), (None, "data/b")]: by size
    blend = Blend([0.7, 0.3], [samples_a, samples_b])  # GPTSamples (or anything with .sample(i))
    blend.locate(n)                                    # (dataset k, its sample m) of blended sample n

Order: the blend runs in rounds of ``ROUND`` = 65,536 samples. Each round gives dataset k ``q_k`` samples (its
weight times ``ROUND``, rounded by largest remainder, so the quotas add up to ``ROUND``), interleaved evenly: the
j-th sample of k within the round sits at rank ``(j + 1/2) / q_k`` among all the round's samples (ties by k).
Blended sample n is therefore a function of n alone (round ``n // ROUND``, then a table of ``ROUND`` entries):
any rank finds any sample without walking the blend from the start, and the order is the same on every grid.
Over any round the realised weights equal the quotas: within 1/65,536 of the requested weights.
"""
from __future__ import annotations

import math
from typing import Optional, Protocol, Sequence

import numpy as np

from .indexed import DataError

ROUND = 1 << 16


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None


def parse_blend(tokens: Sequence[str]) -> list[tuple[Optional[float], str]]:
    """``--data-path`` words as ``[(weight, prefix)]``: ``W1 P1 W2 P2 ...`` (weights > 0, any scale) or only
    prefixes (weights None: each dataset by its size). DataError (one line) naming the word that does not parse."""
    words = [str(t) for t in tokens]
    fix = "write --data-path PREFIX, or --data-path W1 PREFIX1 W2 PREFIX2 ... with weights > 0"
    if not words:
        raise DataError(f"--data-path is empty; {fix}")
    if _number(words[0]) is None:
        numbers = [w for w in words if _number(w) is not None]
        if numbers:
            raise DataError(f"--data-path {' '.join(words)}: {numbers[0]!r} looks like a weight but the first word "
                            f"{words[0]!r} is not one; {fix}")
        return [(None, w) for w in words]
    if len(words) % 2:
        raise DataError(f"--data-path {' '.join(words)}: {len(words)} words, not weight-prefix pairs (the last "
                        f"weight has no prefix); {fix}")
    out: list[tuple[Optional[float], str]] = []
    for i in range(0, len(words), 2):
        w = _number(words[i])
        if w is None or not math.isfinite(w) or w <= 0:
            raise DataError(f"--data-path: weight {words[i]!r} (word {i + 1}) does not parse as a number > 0; {fix}")
        if _number(words[i + 1]) is not None:
            raise DataError(f"--data-path: word {i + 2} {words[i + 1]!r} should be a prefix after weight "
                            f"{words[i]!r}; {fix}")
        out.append((w, words[i + 1]))
    return out


def quotas(weights: Sequence[float], total: int = ROUND) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder); DataError when a weight is
    too small to get one sample per round."""
    s = float(sum(weights))
    exact = [w / s * total for w in weights]
    q = [int(math.floor(x)) for x in exact]
    for i in sorted(range(len(q)), key=lambda i: (q[i] - exact[i], i))[: total - sum(q)]:
        q[i] += 1
    for w, n in zip(weights, q):
        if n == 0:
            raise DataError(f"--data-path: weight {w:g} is below 1/{total} of the total {s:g}: that dataset would "
                            f"never be sampled; raise its weight or leave it out")
    return q


class Samples(Protocol):
    def sample(self, i: int, spans: Optional[Sequence[tuple[int, int]]] = None) -> np.ndarray: ...


class Blend:
    """Blended samples of ``parts`` with ``weights`` (normalised here); see the module docstring."""

    def __init__(self, weights: Sequence[float], parts: Sequence[Samples]) -> None:
        if len(weights) != len(parts) or not parts:
            raise ValueError(f"{len(weights)} weights for {len(parts)} datasets")
        self.parts = list(parts)
        total = float(sum(weights))
        self.weights = [w / total for w in weights]
        self.quota = np.array(quotas(self.weights), dtype=np.int64)
        k = np.concatenate([np.full(q, i, dtype=np.int64) for i, q in enumerate(self.quota)])
        j = np.concatenate([np.arange(q, dtype=np.int64) for q in self.quota])
        rank = (j + 0.5) / self.quota[k]
        order = np.lexsort((k, rank))
        self._k, self._j = k[order], j[order]                     # [ROUND] each: dataset and its index in the round

    def locate(self, n: int) -> tuple[int, int]:
        """Blended sample ``n`` is sample ``m`` of dataset ``k``: ``(k, m)``."""
        r, p = divmod(int(n), ROUND)
        k = int(self._k[p])
        return k, r * int(self.quota[k]) + int(self._j[p])

    def needed(self, n: int) -> list[int]:
        """How many samples of each dataset the first ``n`` blended samples use."""
        r, p = divmod(int(n), ROUND)
        head = np.bincount(self._k[:p], minlength=len(self.parts))
        return [int(r * q + h) for q, h in zip(self.quota, head)]

    def sample(self, n: int, spans: Optional[Sequence[tuple[int, int]]] = None) -> np.ndarray:
        """Blended sample ``n`` (``spans``: only those positions read, as :meth:`GPTSamples.sample`)."""
        k, m = self.locate(n)
        return self.parts[k].sample(m) if spans is None else self.parts[k].sample(m, spans)
