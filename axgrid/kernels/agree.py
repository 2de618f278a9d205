"""Make every rank of a process group use the same GEMM decision.

One rank (``src``) decides — cache lookup or tuning — and broadcasts the winner's name; the others
adopt it. The communication is abstracted as ``broadcast_object(obj, src) -> obj`` so axgrid can pass
its own communication layer; ``torch_group_agreement`` builds one from a torch.distributed group.
Every rank of the group must reach the same decision points in the same order (true for SPMD layers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

T = TypeVar("T")
BroadcastObject = Callable[[Any, int], Any]


@dataclass(frozen=True)
class Agreement:
    """This rank's index in the group, and a collective broadcasting a picklable object from ``src``."""

    rank: int
    broadcast_object: BroadcastObject
    src: int = 0


def agree_on(decide: Callable[[], T], agreement: Agreement) -> T:
    """Run ``decide`` on the source rank only and return its result on every rank of the group.

    If ``decide`` raises on the source rank, the others are told (instead of waiting forever) and
    raise too.
    """
    if agreement.rank != agreement.src:
        value = agreement.broadcast_object(None, agreement.src)
        if isinstance(value, _Failed):
            raise RuntimeError(f"GEMM decision failed on source rank {agreement.src}: {value.reason}")
        return value
    try:
        value = decide()
    except BaseException as exc:
        agreement.broadcast_object(_Failed(repr(exc)), agreement.src)
        raise
    return agreement.broadcast_object(value, agreement.src)


@dataclass(frozen=True)
class _Failed:
    reason: str


def torch_group_agreement(group: Any) -> Agreement:
    """An Agreement over a torch.distributed process group (group-local rank 0 decides)."""
    import torch.distributed as dist  # noqa: PLC0415  (kept optional and local)

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("GemmTuner(group=...) needs torch.distributed initialised first "
                           "(dist.init_process_group), or pass group=None")

    def broadcast_object(obj: Any, src: int) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, src), group=group)
        return box[0]

    return Agreement(rank=dist.get_rank(group), broadcast_object=broadcast_object)
