"""Mixture-of-experts blocks of Hugging Face models on the grid: each ``*SparseMoeBlock`` becomes an
:class:`~axgrid.expert_parallel.ExpertParallelMoE` holding only this rank's experts.

transformers (5.x) keeps a block's experts fused in the model: ``experts.gate_up_proj [E, 2f, h]`` (gate rows, then
up rows) and ``experts.down_proj [E, h, f]``, and its router ``gate.weight [E, h]``; its weight files keep one tensor
per expert and layer (Qwen-MoE: ``experts.<e>.gate_proj``, ``up_proj``, ``down_proj``; Mixtral:
``block_sparse_moe.experts.<e>.w1``, ``w3``, ``w2``). Here expert ``e`` of this rank becomes three 3D Linear layers,
``gate_proj`` and ``up_proj`` (normal, ``[f, h]``) and ``down_proj`` (transposed, ``[h, f]``), each of which
:func:`axgrid.from_pretrained` reads from its own file tensor (this rank's part only; the other ranks' experts are
not read), and the router an :class:`~axgrid.expert_parallel.TopKRouter` whose
class also derives from the model's own router class, so that transformers' output recorder, which finds routers by
type, records its logits (``output_router_logits``, and the auxiliary load-balancing loss computed from them).

Read from the model: the router's ``top_k``, ``num_experts`` and ``norm_topk_prob`` (absent: normalised, as Mixtral
does), the experts' ``act_fn``; refused in one line: top-k larger than the experts, experts not divisible by the
expert-parallel size, Mixtral's router jitter (``router_jitter_noise`` > 0). A shared expert (Qwen2-MoE's
``shared_expert``, gated by ``sigmoid(shared_expert_gate(x))``) becomes a pair of 3D Linear producers and a transposed
consumer, replicated over d like the dense layers, and its gate a column-split ``[1, h]`` weight.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from ..core.grid import EP_DIM, Grid
from ..expert_parallel import ExpertParallelMoE, TopKRouter, check_moe
from ..expert_parallel.moe import ExpertMLP, local_experts
from ..expert_parallel.router import SharedExpertGate
from ..tensor_parallel.linear import Linear
from .parallelize import LinearPlan, parallel_copy

@functools.cache
def router_type(model_router: type) -> type:
    """:class:`TopKRouter` with ``model_router`` mixed in (its forward and init are TopKRouter's); one type per
    model router class."""
    return type(f"Grid{model_router.__name__}", (TopKRouter, model_router), {})


def describe_block(block: nn.Module, name: str) -> tuple[int, int, bool]:
    """``(num_experts, top_k, normalize)`` of a transformers MoE block, or a one-line ValueError naming what this
    block has that the plan does not take."""
    gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
    if gate is None or experts is None or not isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor):
        raise ValueError(f"plan: {name} is not a transformers MoE block (gate, experts.gate_up_proj [E, 2f, h], "
                         f"experts.down_proj [E, h, f]); use plan={{}} (drop-in)")
    shared = getattr(block, "shared_expert", None)
    if shared is not None and not (all(isinstance(getattr(shared, n, None), nn.Linear)
                                       for n in ("gate_proj", "up_proj", "down_proj"))
                                   and isinstance(getattr(block, "shared_expert_gate", None), nn.Linear)):
        raise ValueError(f"plan: {name} has a shared expert that is not gate_proj/up_proj/down_proj with a "
                         f"shared_expert_gate Linear; use plan={{}} (drop-in)")
    if getattr(block, "jitter_noise", 0.0):
        raise ValueError(f"plan: {name} multiplies its input by router jitter noise {block.jitter_noise}; set the "
                         f"config's router_jitter_noise=0 to run it expert-parallel")
    if getattr(experts, "has_bias", False) or getattr(experts, "is_transposed", False):
        raise ValueError(f"plan: {name}'s experts have biases or transposed weights; use plan={{}} (drop-in)")
    return int(gate.num_experts), int(gate.top_k), bool(getattr(gate, "norm_topk_prob", True))


def expert_parallel_block(block: nn.Module, grid: Grid, name: str = "MoE block") -> ExpertParallelMoE:
    """``block``'s router and this rank's experts, on the grid (see the module docstring); on the meta device
    (a model built without memory) the layers are left for a loader to fill."""
    num_experts, top_k, normalize = describe_block(block, name)
    check_moe(num_experts, top_k, grid.size(EP_DIM), name)
    gate, experts = block.gate, block.experts
    h, f = experts.gate_up_proj.shape[2], experts.gate_up_proj.shape[1] // 2
    meta = experts.gate_up_proj.device.type == "meta"
    dtype = experts.gate_up_proj.dtype
    router = router_type(type(gate))(h, num_experts, top_k, grid, normalize=normalize, dtype=gate.weight.dtype)
    if not meta:
        router.load_dense_(gate.weight.detach())
    router.weight.requires_grad_(gate.weight.requires_grad)
    layer = name.rsplit(".", 1)[0]
    aliases(router.weight, [f"{layer}.block_sparse_moe.gate.weight"])
    mixtral = type(block).__name__.startswith("Mixtral")     # its weight files keep the legacy block_sparse_moe names
    if mixtral:
        router.weight.axgrid_export_name = f"{layer}.block_sparse_moe.gate.weight"
    up_plan, down_plan = LinearPlan(False, "sharded", "sharded"), LinearPlan(True, "sharded", "sharded")
    made: dict[int, ExpertMLP] = {}
    for e in local_experts(num_experts, grid):
        parts = []
        for rows, transpose, hf, legacy in ((slice(0, f), False, "gate_proj", "w1"),
                                            (slice(f, 2 * f), False, "up_proj", "w3"), (None, True, "down_proj", "w2")):
            dense = experts.down_proj[e] if transpose else experts.gate_up_proj[e][rows]      # [out, in]
            lin = Linear(dense.shape[1], dense.shape[0], bias=False, transpose=transpose, grid=grid,
                         input_layout="sharded", output_layout="sharded", dtype=dtype, init=False)
            if not meta:
                lin.load_dense_(dense.detach())
            lin.weight.requires_grad_((experts.down_proj if transpose else experts.gate_up_proj).requires_grad)
            aliases(lin.weight, [f"{name}.experts.{e}.{hf}.weight",
                                 f"{layer}.block_sparse_moe.experts.{e}.{legacy}.weight"])
            if mixtral:
                lin.weight.axgrid_export_name = f"{layer}.block_sparse_moe.experts.{e}.{legacy}.weight"
            parts.append(lin)
        made[e] = ExpertMLP(*parts, experts.act_fn)
    shared, shared_gate = None, None
    if getattr(block, "shared_expert", None) is not None:
        mlp = block.shared_expert
        shared = ExpertMLP(parallel_copy(mlp.gate_proj, grid, up_plan), parallel_copy(mlp.up_proj, grid, up_plan),
                           parallel_copy(mlp.down_proj, grid, down_plan), mlp.act_fn)
        dense_gate = block.shared_expert_gate.weight
        shared_gate = SharedExpertGate(h, grid, dtype=dense_gate.dtype)
        if not meta:
            shared_gate.load_dense_(dense_gate.detach())
        shared_gate.weight.requires_grad_(dense_gate.requires_grad)
    return ExpertParallelMoE(router, made, grid, shared, shared_gate)


def aliases(param: torch.nn.Parameter, names: list[str]) -> None:
    """Other names ``param`` goes by in Hugging Face weight files (``axgrid_file_names``, which
    :func:`axgrid.from_pretrained` also looks for): an expert's ``.../experts.<e>.gate_proj.weight`` (Qwen-MoE) or
    ``.../block_sparse_moe.experts.<e>.w1.weight`` (Mixtral's files; ``w3`` up, ``w2`` down), Mixtral's router
    ``.../block_sparse_moe.gate.weight``. A Mixtral's expert and router weights also carry ``axgrid_export_name``,
    the legacy name :func:`axgrid.export_pretrained` writes (transformers converts those names of a Mixtral file into
    its fused experts, not the ``mlp.experts.<e>`` ones)."""
    param.axgrid_file_names = list(names)


def check_blocks(model: nn.Module, names: list[str], grid: Grid) -> None:
    """Every MoE block of ``names`` fits ``grid`` (one line otherwise, before any collective)."""
    for n in names:
        num_experts, top_k, _ = describe_block(model.get_submodule(n), n)
        check_moe(num_experts, top_k, grid.size(EP_DIM), n)


def use_expert_parallel(model: nn.Module, names: list[str], grid: Grid) -> None:
    """Swap each MoE block of ``names`` for its expert-parallel block, in place."""
    for n in names:
        parent = model.get_submodule(n.rsplit(".", 1)[0]) if "." in n else model
        setattr(parent, n.rsplit(".", 1)[-1], expert_parallel_block(model.get_submodule(n), grid, n))
