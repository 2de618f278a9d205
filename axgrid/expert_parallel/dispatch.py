"""Tokens to their experts' ranks and back: all-to-all of uneven sizes over the expert-parallel group ``"e"``.

On every rank of one x·y block the routing is the same (the router's logits are all-reduced over x, and y holds
copies), so the sizes sent and received agree across the block and each expert's 3D Linear layers see the same
tokens on every x·y rank. With ``T`` tokens, ``k`` experts per token, ``E`` experts of which ``E_l = E / E_p`` on each
of the ``E_p`` ranks of ``"e"``, and ``h/Gx`` features per token on this rank:

==================  ===============================  =====================================================
step                tensor on this rank              what
==================  ===============================  =====================================================
assignments         ``[T·k]``                        (token, expert) pairs sorted by expert: ``order``
sent                ``[T·k, h/Gx]``                  the tokens' rows in that order; member ``j`` of ``"e"``
                                                     gets the rows for its experts (``send_sizes[j]``)
received            ``[R, h/Gx]``                    from member 0, 1, ...; inside each, by local expert
by expert           ``[R, h/Gx]``                    regrouped so that each local expert's rows are together
==================  ===============================  =====================================================

and back the same way in reverse (:func:`combine_rows`). Nothing is dropped: every assignment is computed, as
transformers does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.grid import EP_DIM, Grid


class _AllToAll(torch.autograd.Function):
    """Rows to the members of ``"e"`` (forward); the gradient rows back the opposite way (backward)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, grid: Grid, send: list[int],  # type: ignore[override]
                recv: list[int]) -> torch.Tensor:
        ctx.grid, ctx.send, ctx.recv = grid, send, recv
        return grid.comm.all_to_all_uneven(rows, EP_DIM, send, recv)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return ctx.grid.comm.all_to_all_uneven(grad.contiguous(), EP_DIM, ctx.recv, ctx.send), None, None, None


@dataclass
class Routing:
    """Where this rank's assignments go and what it receives (see the module docstring).

    ``order [T·k]``: assignment positions (token·k + slot) sorted by expert; ``send_sizes``/``recv_sizes``: rows per
    member of ``"e"``; ``by_expert [R]``: the received rows' positions grouped by local expert;
    ``expert_rows``: rows per local expert."""

    order: torch.Tensor
    send_sizes: list[int]
    recv_sizes: list[int]
    by_expert: torch.Tensor
    expert_rows: list[int]


def plan_routing(indices: torch.Tensor, num_experts: int, grid: Grid) -> Routing:
    """The routing of ``indices [T, k]`` (global expert ids) over ``"e"``: one all-to-all of the per-expert counts
    (``E`` int64 per rank), read on the host (the sizes of the rows' all-to-all)."""
    ep = grid.size(EP_DIM)
    local = num_experts // ep
    flat = indices.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)                         # [E]
    send_sizes = counts.view(ep, local).sum(1).tolist()
    got = grid.comm.all_to_all_uneven(counts, EP_DIM, [local] * ep, [local] * ep) if ep > 1 else counts
    got = got.view(ep, local)                                                    # [source, local expert]
    recv_sizes = got.sum(1).tolist()
    starts = torch.cumsum(got.reshape(-1), 0) - got.reshape(-1)                 # where each (source, expert) begins
    starts, sizes = starts.view(ep, local).tolist(), got.tolist()
    pieces = [torch.arange(starts[s][e], starts[s][e] + sizes[s][e]) for e in range(local) for s in range(ep)]
    by_expert = torch.cat(pieces).to(indices.device) if pieces else indices.new_zeros(0)
    expert_rows = got.sum(0).tolist()
    return Routing(order, send_sizes, recv_sizes, by_expert, expert_rows)


def even_split(total: int, parts: int) -> list[int]:
    """``total`` rows over ``parts`` as evenly as whole rows allow (the first ``total % parts`` get one more)."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def uniform_routing(indices: torch.Tensor, num_experts: int, grid: Grid) -> Routing:
    """The routing of ``indices [T, k]`` as if every expert got the same share of the assignments (perfmodel's
    assumption, ``perfmodel.moe``): each member of ``"e"`` is sent ``T·k/E_p`` rows, each local expert runs
    ``T·k/E_l`` of those received (whole rows, the remainder to the first). The counts' all-to-all is posted as
    :func:`plan_routing` posts it, so the collectives are the runtime's; the positions are a fixed permutation. For
    the dry run, whose fake tensors hold no values to route by (``torch.bincount`` and ``tolist`` need data); a
    real run routes with :func:`plan_routing`."""
    ep = grid.size(EP_DIM)
    local = num_experts // ep
    rows = indices.numel()
    counts = indices.new_zeros(num_experts)
    if ep > 1:
        grid.comm.all_to_all_uneven(counts, EP_DIM, [local] * ep, [local] * ep)
    send = even_split(rows, ep)
    recv = [send[grid.index(EP_DIM)]] * ep                       # every member sends this rank the same share
    received = sum(recv)
    order = torch.arange(rows, device=indices.device)
    by_expert = torch.arange(received, device=indices.device)
    return Routing(order, send, recv, by_expert, even_split(received, local))


def dispatch_rows(x: torch.Tensor, routing: Routing, k: int, grid: Grid) -> torch.Tensor:
    """``x [T, h/Gx]`` -> this rank's experts' rows ``[R, h/Gx]``, grouped by local expert (differentiable)."""
    sent = x[routing.order // k]
    if grid.size(EP_DIM) > 1:
        sent = _AllToAll.apply(sent, grid, routing.send_sizes, routing.recv_sizes)
    return sent[routing.by_expert]


def combine_rows(y: torch.Tensor, routing: Routing, grid: Grid) -> torch.Tensor:
    """This rank's experts' outputs ``[R, h/Gx]`` (grouped by local expert) -> each assignment's output back at its
    source, ``[T·k, h/Gx]`` in assignment order ``token·k + slot`` (differentiable)."""
    back = y[torch.argsort(routing.by_expert)]                                   # by source again
    if grid.size(EP_DIM) > 1:
        back = _AllToAll.apply(back, grid, routing.recv_sizes, routing.send_sizes)
    return back[torch.argsort(routing.order)]
