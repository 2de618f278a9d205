"""What a fine-tuning run trains on and is scored on: a plain text or a chat file, split into training batches and
held-out rows that are never trained on.

    data = TextSource(tokens, seq=128, seed=0, heldout_frac=0.1, heldout_rows=32, name="kjv.txt")
    data = ChatSource(chat_data, heldout_rows=32)                  # from axgrid.data.chat.load_chat
    inputs, targets, mask = data.batch(step, size)                 # [size, seq] each; mask None for plain text
    for i in range(data.valid_iters(size)):                        # the held-out rows, in batches of size rows
        inputs, targets, mask = data.valid_batch(i, size)          # the last padded with empty rows (mask 0)

Both build every batch from ``(seed, step)`` alone, so every rank holds the same global batch and a resumed run
sees the same batches (:class:`axgrid.driver.RunData` takes either as a driver's own batches and scores the
held-out rows). ``info`` is what the log's config row records, ``describe`` a line for stdout, ``max_id`` the
largest token id (checked against the model's vocabulary).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

from .chat import ChatData
from .windows import TokenWindows, spaced_windows

Rows = tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


class HeldOut:
    """Held-out rows ``inputs/targets/mask [H, seq]`` (mask 1 where a target counts), served in batches of ``size``
    rows for :func:`axgrid.driver.evaluate.evaluate`; the last batch is padded with empty rows."""

    heldout: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    def valid_iters(self, size: int) -> int:
        return 0 if self.heldout is None else math.ceil(self.heldout[0].shape[0] / size)

    def valid_batch(self, i: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs, targets, mask = (t[i * size:(i + 1) * size] for t in self.heldout)
        pad = size - inputs.shape[0]
        if pad:
            inputs, targets = (torch.cat([t, t[:1].expand(pad, -1)]) for t in (inputs, targets))
            mask = torch.cat([mask, torch.zeros(pad, mask.shape[1])])
        return inputs, targets, mask


class TextSource(HeldOut):
    """Random windows of ``seq + 1`` tokens of ``tokens [T]`` before its held-out end (the last ``heldout_frac``),
    and at most ``heldout_rows`` evenly spaced, non-overlapping windows of that end. ValueError when the text is
    too short for either."""

    def __init__(self, tokens: torch.Tensor, seq: int, seed: int, heldout_frac: float = 0.0, heldout_rows: int = 32,
                 name: str = "the text") -> None:
        cut = tokens.numel() - int(tokens.numel() * heldout_frac)
        self.windows = TokenWindows(tokens[:cut], seq, seed, name)
        if cut < tokens.numel():
            held = tokens[cut:]
            n = min(heldout_rows, held.numel() // (seq + 1))
            if n < 1:
                raise ValueError(f"{name}: its held-out end ({held.numel()} tokens, fraction {heldout_frac}) is "
                                 f"shorter than one row of {seq + 1} tokens")
            inputs, targets = spaced_windows(held, seq, n)
            self.heldout = (inputs, targets, torch.ones(inputs.shape))
        self.max_id = int(tokens.max())
        self.info: dict[str, Any] = {"data": "text", "text_tokens": int(tokens.numel()),
                                     "heldout_rows": 0 if self.heldout is None else int(self.heldout[0].shape[0])}
        self.describe = f"{tokens.numel():,} tokens of text"

    def batch(self, step: int, size: int) -> Rows:
        return (*self.windows.batch(step, size), None)


class ChatSource(HeldOut):
    """The rows of :func:`~axgrid.data.chat.load_chat` (training) and at most ``heldout_rows`` of its held-out
    rows; batches carry the assistant-token mask."""

    def __init__(self, chat: ChatData, heldout_rows: int = 32) -> None:
        self.rows = chat.train
        if chat.heldout is not None:
            h, n = chat.heldout, min(len(chat.heldout), heldout_rows)
            self.heldout = (h.inputs[:n], h.targets[:n], h.mask[:n])
        self.max_id = max(int(chat.train.inputs.max()), int(chat.train.targets.max()))
        self.info = {"data": "chat", "conversations": chat.conversations,
                     "heldout_conversations": chat.heldout_conversations, "rows": len(chat.train),
                     "assistant_tokens": chat.train.assistant_tokens, "truncated": chat.train.truncated,
                     "heldout_rows": 0 if self.heldout is None else int(self.heldout[0].shape[0])}
        self.describe = (f"{chat.conversations} conversations ({chat.heldout_conversations} held out) in "
                         f"{len(chat.train)} rows, {chat.train.assistant_tokens:,} assistant tokens")

    def batch(self, step: int, size: int) -> Rows:
        return self.rows.batch(step, size)
