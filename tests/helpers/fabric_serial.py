"""The serial reference of examples/fabric_train.py: its model and data trained in one process with torch alone, on
each step's whole batch (what the Fabric loop on any grid must reproduce)."""
from __future__ import annotations

import torch

from . import load_example


def serial_fabric_losses(steps: int, batch: int, seq: int, lr: float = 3e-3, clip: float = 1.0) -> list[float]:
    mod = load_example("fabric_train.py")
    model = mod.make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    windows = mod.byte_windows(steps * batch, seq)
    losses = []
    for step in range(steps):
        w = windows[step * batch:(step + 1) * batch]
        x, y = w[:, :-1], w[:, 1:].contiguous()
        loss = model(input_ids=x, labels=y, shift_labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
