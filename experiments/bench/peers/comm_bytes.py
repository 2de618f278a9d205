"""Bytes of PyTorch's own collectives, counted as axgrid's ledger counts its own (the all-reduced tensor, the
all-gather's output, the reduce-scatter's input; this rank), through torch's ``CommDebugMode``."""
from __future__ import annotations

from collections import defaultdict

import torch


def collective_bytes(name: str, args: tuple) -> int:
    """Ledger-convention bytes of one collective from its dispatcher arguments: the largest tensor (the
    all-reduced tensor, a flat all-gather's output, a flat reduce-scatter's input); a list-of-lists argument
    (c10d's list all-gather/reduce-scatter) counts as the sum of its inner list; a functional all-gather
    (``input, group_size, group``) as the input times the group size."""
    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()
    best = 0
    for a in args:
        if isinstance(a, torch.Tensor):
            best = max(best, nbytes(a))
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    best = max(best, nbytes(b))
                elif isinstance(b, (list, tuple)):
                    best = max(best, sum(nbytes(c) for c in b if isinstance(c, torch.Tensor)))
    if "gather" in name and len(args) > 1 and isinstance(args[0], torch.Tensor) and isinstance(args[1], int):
        best = nbytes(args[0]) * args[1]
    return best


def byte_comm_mode():
    """A CommDebugMode that also adds up each collective's buffer bytes (ledger convention)."""
    from torch.distributed.tensor.debug import CommDebugMode
    try:
        from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops
    except ImportError:
        c10d_collective_ops = set()

    class ByteCommMode(CommDebugMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes: dict[str, int] = defaultdict(int)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
                return out
            pkt = func._overloadpacket
            if pkt in self.comm_registry or pkt in c10d_collective_ops:
                name = str(pkt).split(".")[-1]
                self.bytes[name] += collective_bytes(name, args)
            return out

    return ByteCommMode()
