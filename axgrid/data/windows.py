"""Training batches that are a function of ``(seed, step)``: every rank builds the same global batch and takes its
own rows, so no data is communicated and a resumed run (on any grid) sees the same batches.

    data = TokenWindows(tokens, seq=128, seed=0)        # random windows of seq + 1 tokens of a stream [T]
    inputs, targets = data.batch(step, size)            # [size, seq] each; targets are inputs shifted by one
    inputs, targets = spaced_windows(tokens, seq, 16)   # fixed, evenly spaced windows (held-out evaluation)
"""
from __future__ import annotations

from pathlib import Path

import torch

from .tokenizers import ByteTokenizer


class TokenWindows:
    """Random windows of ``seq + 1`` tokens from a token stream ``tokens [T]``; batch ``step`` is a function of
    (seed, step): ``batch(step, size)`` gives ``(inputs [size, seq], targets [size, seq])``."""

    def __init__(self, tokens: torch.Tensor, seq: int, seed: int, source: str = "the text") -> None:
        if tokens.numel() < seq + 2:
            raise ValueError(f"{source} has {tokens.numel()} tokens, fewer than one window of {seq + 1}")
        self.tokens, self.seq, self.seed = tokens, seq, seed

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, self.tokens.numel() - self.seq - 1, (size,), generator=gen)
        win = torch.stack([self.tokens[s: s + self.seq + 1] for s in starts.tolist()])
        return win[:, :-1], win[:, 1:]


def spaced_windows(tokens: torch.Tensor, seq: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` evenly spaced windows of ``seq + 1`` tokens of ``tokens [T]``, first and last included (fixed,
    for held-out evaluation; they overlap when ``count·(seq + 1) > T``): ``(inputs [count, seq], targets)``."""
    if tokens.numel() < seq + 1:
        raise ValueError(f"{tokens.numel()} held-out tokens are fewer than one window of {seq + 1}")
    starts = torch.linspace(0, tokens.numel() - seq - 1, count).long().tolist()
    win = torch.stack([tokens[s: s + seq + 1] for s in starts])
    return win[:, :-1], win[:, 1:]


class TextBatches(TokenWindows):
    """:class:`TokenWindows` of a byte-tokenized UTF-8 text file."""

    def __init__(self, path: str | Path, seq: int, seed: int) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        super().__init__(ByteTokenizer().encode(path.read_text(encoding="utf-8")), seq, seed, str(path))


class SyntheticBatches:
    """Uniform random token ids ``[size, seq]``; batch ``step`` is a function of (seed, step)."""

    def __init__(self, vocab: int, seq: int, seed: int) -> None:
        self.vocab, self.seq, self.seed = vocab, seq, seed

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        win = torch.randint(0, self.vocab, (size, self.seq + 1), generator=gen)
        return win[:, :-1], win[:, 1:]
