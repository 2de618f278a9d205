"""Conversations for instruction fine-tuning (SFT): a JSON-lines file, rendered with the checkpoint's chat template,
tokenized with a mask of the assistant's tokens, and laid out in rows of ``seq + 1`` tokens.

    conversations = read_chat_file("data.jsonl")               # ChatFormatError "FILE:LINE: what is wrong"
    examples = [tokenize_chat(c, tokenizer) for c in conversations]
    rows = ChatRows.pack(examples, seq=128, pad_id=tokenizer.pad_token_id, seed=0)   # or ChatRows.pad(...)
    inputs, targets, mask = rows.batch(step, size)              # [size, seq] each; mask 1 on assistant targets

A line is ``{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}`` or
``{"prompt": "...", "response": "..."}`` (a user turn and the assistant's answer); blank lines are skipped.

The loss covers the assistant's tokens only (the SFT convention): the tokens each assistant message adds to the
rendered conversation, its end-of-turn token included, so the model learns to stop. ``apply_chat_template``'s own
``return_assistant_tokens_mask`` needs ``{% generation %}`` markers that most templates (SmolLM2's, Llama's, Qwen's)
lack, so the assistant spans are found here by rendering incrementally: the conversation up to an assistant
message with the generation prompt, then with that message; the characters between are the assistant's, and a
token is the assistant's when it starts inside them (the fast tokenizer's offsets). A template that does not render
conversations as a growing prefix is refused with a one-line message.

Layouts: ``pad`` puts each conversation in its own row (cut at ``seq + 1`` tokens, padding never in the loss);
``pack`` concatenates them into one stream cut into rows (no padding; a conversation may span two rows). Batches are
a function of ``(seed, step)``: each epoch visits every row once in a seeded order, so every rank builds the same
global batch and a resumed run sees the same batches.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

ROLES = ("system", "user", "assistant")
LAYOUTS = ("pack", "pad")
Conversation = list[dict[str, str]]


class ChatFormatError(ValueError):
    """A chat file or template that cannot be used: the message names the file and line, and what is wrong."""


def _conversation(obj: Any) -> tuple[Optional[Conversation], str]:
    """``(messages, "")`` for a valid line's object, else ``(None, what is wrong)``."""
    if not isinstance(obj, dict):
        return None, f"a line must be a JSON object, not {type(obj).__name__}"
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            return None, '"messages" must be a non-empty list of {"role": ..., "content": ...}'
        for i, m in enumerate(msgs, 1):
            if not isinstance(m, dict) or set(m) - {"role", "content"} or "role" not in m or "content" not in m:
                return None, f'message {i} must be an object with exactly "role" and "content"'
            if m["role"] not in ROLES:
                return None, f"message {i} has role {m['role']!r}; use one of {', '.join(ROLES)}"
            if not isinstance(m["content"], str):
                return None, f'message {i}\'s "content" must be a string, not {type(m["content"]).__name__}'
        if not any(m["role"] == "assistant" for m in msgs):
            return None, "no assistant message: there is nothing to train on"
        return [dict(m) for m in msgs], ""
    if "prompt" in obj or "response" in obj:
        for key in ("prompt", "response"):
            if not isinstance(obj.get(key), str):
                return None, f'"{key}" must be a string' + ("" if key in obj else " and is missing")
        extra = set(obj) - {"prompt", "response"}
        if extra:
            return None, f"unexpected keys {sorted(extra)} beside prompt and response"
        return [{"role": "user", "content": obj["prompt"]}, {"role": "assistant", "content": obj["response"]}], ""
    return None, 'neither "messages" nor "prompt" and "response"'


def read_chat_file(path: str | Path) -> tuple[list[Conversation], list[int]]:
    """The conversations of the JSON-lines file ``path`` and their line numbers; :class:`ChatFormatError`
    ``"FILE:LINE: what is wrong"`` at the first malformed line (nothing else is read)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ChatFormatError(f"{path}: cannot be read as UTF-8 text ({e})") from None
    conversations, numbers = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ChatFormatError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
        conv, why = _conversation(obj)
        if conv is None:
            raise ChatFormatError(f"{path}:{n}: {why}")
        conversations.append(conv)
        numbers.append(n)
    if not conversations:
        raise ChatFormatError(f"{path}: holds no conversations (one JSON object per line: "
                              f'{{"messages": [...]}} or {{"prompt": ..., "response": ...}})')
    return conversations, numbers


@dataclass(frozen=True)
class ChatTokens:
    """One conversation: ``ids [T]`` (int64) and ``assistant [T]`` (bool, the tokens the loss covers)."""
    ids: torch.Tensor
    assistant: torch.Tensor


def check_chat_tokenizer(tokenizer: Optional[Any], checkpoint: str) -> None:
    """ChatFormatError unless ``tokenizer`` is a fast tokenizer with a chat template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ChatFormatError(f"{checkpoint} has no tokenizer with a chat template, which conversations are "
                              f"rendered with: use a checkpoint that ships one, or train on --text-file")
    if not getattr(tokenizer, "is_fast", False):
        raise ChatFormatError(f"{checkpoint}'s tokenizer is not a fast tokenizer (no character offsets), which the "
                              f"assistant-token mask needs; save a tokenizer.json with the checkpoint")


def tokenize_chat(conversation: Conversation, tokenizer: Any, where: str = "a conversation") -> ChatTokens:
    """``conversation`` rendered with ``tokenizer``'s chat template and tokenized, with its assistant mask (see the
    module docstring); ``where`` names it in errors (e.g. ``FILE:LINE``)."""
    def render(msgs: Sequence[dict[str, str]], prompt: bool) -> str:
        return tokenizer.apply_chat_template(list(msgs), tokenize=False, add_generation_prompt=prompt)
    text = render(conversation, False)
    spans = []
    for i, m in enumerate(conversation):
        if m["role"] != "assistant":
            continue
        before, upto = render(conversation[:i], True), render(conversation[: i + 1], False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise ChatFormatError(f"{where}: the chat template does not render the conversation as a growing "
                                  f"prefix, so the assistant's tokens cannot be found; use a ChatML-like template")
        spans.append((len(before), len(upto)))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor(enc["input_ids"], dtype=torch.long)
    starts = torch.tensor([s for s, _ in enc["offset_mapping"]], dtype=torch.long)
    assistant = torch.zeros(ids.numel(), dtype=torch.bool)
    for lo, hi in spans:
        assistant |= (starts >= lo) & (starts < hi)
    return ChatTokens(ids, assistant)


class ChatRows:
    """Rows of ``seq + 1`` tokens and their masks: ``inputs [N, seq]``, ``targets [N, seq]``, ``mask [N, seq]``
    (float, 1 where the target is an assistant token). Build with :meth:`pack` or :meth:`pad`."""

    def __init__(self, tokens: torch.Tensor, keep: torch.Tensor, seed: int, truncated: int = 0) -> None:
        self.inputs, self.targets = tokens[:, :-1], tokens[:, 1:]
        self.mask = keep[:, 1:].float()
        self.seed, self.truncated = seed, truncated

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def assistant_tokens(self) -> int:
        return int(self.mask.sum().item())

    @classmethod
    def pack(cls, examples: Sequence[ChatTokens], seq: int, pad_id: int, seed: int = 0) -> "ChatRows":
        """The examples concatenated and cut into rows; row ``r`` holds tokens ``[r·seq, r·seq + seq]`` of the
        stream (each target appears in one row), the last row padded (padding is never in the loss)."""
        ids = torch.cat([e.ids for e in examples])
        keep = torch.cat([e.assistant for e in examples])
        rows = max(1, math.ceil((ids.numel() - 1) / seq))
        total = rows * seq + 1
        ids = torch.cat([ids, torch.full((total - ids.numel(),), pad_id, dtype=torch.long)])
        keep = torch.cat([keep, torch.zeros(total - keep.numel(), dtype=torch.bool)])
        index = torch.arange(rows)[:, None] * seq + torch.arange(seq + 1)[None, :]
        return cls(ids[index], keep[index], seed)

    @classmethod
    def pad(cls, examples: Sequence[ChatTokens], seq: int, pad_id: int, seed: int = 0) -> "ChatRows":
        """One row per example: cut at ``seq + 1`` tokens (counted in ``truncated``), padded after."""
        tokens = torch.full((len(examples), seq + 1), pad_id, dtype=torch.long)
        keep = torch.zeros(len(examples), seq + 1, dtype=torch.bool)
        truncated = 0
        for r, e in enumerate(examples):
            n = min(e.ids.numel(), seq + 1)
            truncated += int(e.ids.numel() > seq + 1)
            tokens[r, :n], keep[r, :n] = e.ids[:n], e.assistant[:n]
        return cls(tokens, keep, seed, truncated)

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Global batch ``step``: ``size`` rows of the seeded epoch order (rows ``step·size ...`` of the
        concatenated per-epoch permutations); ``(inputs, targets, mask)``, each ``[size, seq]``."""
        n = len(self)
        orders: dict[int, torch.Tensor] = {}
        picks = []
        for k in range(step * size, (step + 1) * size):
            epoch, i = divmod(k, n)
            if epoch not in orders:
                orders[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))
            picks.append(int(orders[epoch][i]))
        idx = torch.tensor(picks)
        return self.inputs[idx], self.targets[idx], self.mask[idx]


@dataclass(frozen=True)
class ChatData:
    """A chat file split into training rows and held-out rows (the last conversations of the file)."""
    train: ChatRows
    heldout: Optional[ChatRows]
    conversations: int
    heldout_conversations: int


def load_chat(path: str | Path, tokenizer: Any, seq: int, layout: str = "pack", heldout_frac: float = 0.0,
              seed: int = 0, conversations: Optional[tuple[list[Conversation], list[int]]] = None) -> ChatData:
    """:func:`read_chat_file` (or the already read ``conversations``), :func:`tokenize_chat`, then
    :meth:`ChatRows.pack` / :meth:`ChatRows.pad`; the last ``round(heldout_frac · N)`` conversations are held out
    (never trained on). ChatFormatError for a conversation without an assistant token inside the layout."""
    if layout not in LAYOUTS:
        raise ChatFormatError(f"layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    convs, numbers = conversations if conversations is not None else read_chat_file(path)
    examples = [tokenize_chat(c, tokenizer, f"{path}:{n}") for c, n in zip(convs, numbers)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ChatFormatError("the tokenizer has neither a pad nor an eos token to pad rows with")
    held = round(heldout_frac * len(examples)) if heldout_frac > 0 else 0
    if held >= len(examples):
        raise ChatFormatError(f"{path}: {len(examples)} conversation(s) leave none to train on after holding out "
                              f"{held}; lower the held-out fraction or add conversations")
    if layout == "pad":
        for e, n in zip(examples, numbers):
            if not bool(e.assistant[1: seq + 1].any()):
                raise ChatFormatError(f"{path}:{n}: no assistant token within the first {seq + 1} tokens of the "
                                      f"rendered conversation ({e.ids.numel()} tokens); raise --seq or shorten it")
    build = ChatRows.pack if layout == "pack" else ChatRows.pad
    train = build(examples[: len(examples) - held], seq, pad_id, seed)
    heldout = build(examples[len(examples) - held:], seq, pad_id, seed) if held else None
    return ChatData(train, heldout, len(examples) - held, held)
