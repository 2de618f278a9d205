"""A mixture-of-experts block on the grid: route, dispatch over ``"e"``, this rank's experts, combine.

Shapes on this rank (``T`` tokens of its x·y·z block, ``k`` experts per token, ``E`` experts, ``E_p`` ranks in
``"e"``):

=================  ===============================  ==========================================================
step               tensor                           how
=================  ===============================  ==========================================================
stream in          ``[T, h/Gx]``                    the plan's residual-stream layout (copies over y)
router             ``weights, indices [T, k]``      :class:`~axgrid.expert_parallel.router.TopKRouter`
dispatch           ``[R, h/Gx]``                    all-to-all over ``"e"``, grouped by local expert
expert ``e``       ``[R_e, h/Gx] -> [R_e, h/Gx]``   ``gate_proj``, ``up_proj`` (normal 3D Linear layers,
                                                    ``[R_e, f/Gy]``), ``act(gate)·up``, ``down_proj``
                                                    (transposed 3D Linear) back to the stream layout
combine            ``[T, h/Gx]``                    all-to-all back; ``sum_k weight_k · out_k`` per token
=================  ===============================  ==========================================================

Every local expert runs on every rank, with no rows if none were routed to it, so that the collectives of its 3D Linear
layers (the weight's all-gather over z, its gradient's reduce-scatter) are posted alike on every rank. This rank holds
experts ``[i·E/E_p, (i+1)·E/E_p)``, ``i`` its index in ``"e"`` (``d mod E_p``); their parameters are marked
``axgrid_expert`` and reduce over the expert-replica group ``"r"`` only (:mod:`axgrid.data_parallel.gradients`).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..core.grid import EP_DIM, Grid
from .dispatch import Routing, combine_rows, dispatch_rows, plan_routing
from .router import SharedExpertGate, TopKRouter, sum_grad_over_x


def check_moe(num_experts: int, top_k: int, ep: int, where: str = "MoE") -> None:
    """One line, before any collective, when the experts do not spread over ``ep`` ranks or ``top_k`` is too large."""
    if top_k < 1 or top_k > num_experts:
        raise ValueError(f"{where}: top-k={top_k} experts per token but the model has {num_experts} experts; "
                         f"choose num_experts_per_tok in 1..{num_experts}")
    if num_experts % ep:
        raise ValueError(f"{where}: {num_experts} experts do not divide over the expert-parallel size ep={ep}; "
                         f"choose ep in {[e for e in range(1, num_experts + 1) if num_experts % e == 0]} that also "
                         f"divides Gd")


def local_experts(num_experts: int, grid: Grid) -> range:
    """The global ids of the experts this rank holds."""
    per = num_experts // grid.size(EP_DIM)
    i = grid.index(EP_DIM)
    return range(i * per, (i + 1) * per)


class ExpertMLP(nn.Module):
    """One expert's feed-forward on the grid (a routed expert, or a shared expert every token goes through):
    ``gate_proj`` and ``up_proj`` (normal 3D Linear layers, ``[m, h/Gx] -> [m, f/Gy]``), ``act(gate)·up``,
    ``down_proj`` (transposed, back to ``[m, h/Gx]``). The layers are built by the plan (the room takes them as
    modules); their names are those of the checkpoints' per-expert tensors."""

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module,
                 act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj, self.act_fn = gate_proj, up_proj, down_proj, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ExpertParallelMoE(nn.Module):
    """The block (see the module docstring). ``gate``: the router; ``experts``: this rank's experts by global id (a
    ``ModuleDict`` whose keys are the ids, so parameter names say which expert they are). ``shared_expert`` and
    ``shared_expert_gate`` (Qwen2-MoE): every token also gets ``sigmoid(gate(x)) · shared_expert(x)``.

    ``planner(indices, num_experts, grid) -> Routing``: how the router's choices become the dispatch's sizes;
    :func:`~axgrid.expert_parallel.dispatch.plan_routing` (the runtime's), or ``uniform_routing`` for a dry run's
    fake tensors (``axgrid.dryrun.step``), which have no values to count.

    Forward: ``[..., h/Gx]`` -> ``[..., h/Gx]`` (the stream layout in and out)."""

    def __init__(self, gate: TopKRouter, experts: dict[int, ExpertMLP], grid: Grid,
                 shared_expert: "ExpertMLP | None" = None,
                 shared_expert_gate: "SharedExpertGate | None" = None) -> None:
        super().__init__()
        check_moe(gate.num_experts, gate.top_k, grid.size(EP_DIM))
        want = list(local_experts(gate.num_experts, grid))
        if sorted(experts) != want:
            raise ValueError(f"ExpertParallelMoE: rank {grid.rank} holds experts {want} (index {grid.index(EP_DIM)} "
                             f"of ep={grid.size(EP_DIM)}), given {sorted(experts)}")
        self.grid, self.gate = grid, gate
        self.num_experts, self.top_k = gate.num_experts, gate.top_k
        self.experts = nn.ModuleDict({str(e): experts[e] for e in want})
        for p in self.experts.parameters():
            p.axgrid_expert = True
        if (shared_expert is None) != (shared_expert_gate is None):
            raise ValueError("ExpertParallelMoE: a shared expert comes with its gate (give both or neither)")
        self.shared_expert, self.shared_expert_gate = shared_expert, shared_expert_gate
        self.planner: Callable[[torch.Tensor, int, Grid], Routing] = plan_routing

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        lead, f = hidden.shape[:-1], hidden.shape[-1]
        x = hidden.reshape(-1, f)                                                  # [T, h/Gx]
        _, weights, indices = self.gate(x)                                         # [T, k] each
        routing = self.planner(indices, self.num_experts, self.grid)
        rows = dispatch_rows(x, routing, self.top_k, self.grid)                    # [R, h/Gx]
        outs, start = [], 0
        for expert, n in zip(self.experts.values(), routing.expert_rows):
            outs.append(expert(rows[start:start + n]))
            start += n
        back = combine_rows(torch.cat(outs), routing, self.grid)                   # [T·k, h/Gx]
        w = sum_grad_over_x(weights, self.grid).reshape(-1, 1)
        out = (back * w).to(x.dtype).view(-1, self.top_k, f).sum(1)
        if self.shared_expert is not None:
            g = sum_grad_over_x(self.shared_expert_gate(x), self.grid)           # [T, 1], partial over x in backward
            out = out + g * self.shared_expert(x)
        return out.reshape(*lead, f)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts} (here {list(self.experts)}), top_k={self.top_k}"


def expert_parameters(model: nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of ``model`` that belong to experts (distinct over ``"e"``)."""
    return [p for p in model.parameters() if getattr(p, "axgrid_expert", False)]


__all__ = ["ExpertParallelMoE", "ExpertMLP", "check_moe", "local_experts", "expert_parameters"]
