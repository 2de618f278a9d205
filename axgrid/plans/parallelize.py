"""Swap the ``nn.Linear`` modules of an existing model for parallel ones.

The plan says, per Linear (by qualified name), whether it is transposed and which of its sides stay in the
layer layout. The safe default is "drop-in everywhere": every Linear takes and returns replicated tensors,
which is correct whatever runs between layers. :func:`pair` marks a normal -> transposed pair (MLP up/down,
QKV/out-projection) whose in-between computation is per-token and per-feature (elementwise), so the pair
skips the redistribution between them. ``auto_pair=True`` pairs automatically inside ``nn.Sequential``
containers where only stateless elementwise activations separate two Linear layers.

A Linear whose features do not divide the grid stays dense, with a warning; it is never silently wrong.

Whatever the plan leaves as it was (norms of a drop-in model, dense leftovers, rotary ``inv_freq`` buffers) moves
to the grid's device (:func:`move_to_device`): a model built on the CPU and parallelized onto GPUs holds no tensor
on the host afterwards.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Union

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from ..core.grid import Grid
from ..tensor_parallel.linear import Linear
from ..io.export import guard_save_pretrained
from .ties import report, tied_linears

if TYPE_CHECKING:
    from . import TransformerPlan

#: Modules that act on each element alone and are deterministic, so sharded tokens/features pass through.
ELEMENTWISE = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.LeakyReLU, nn.ELU, nn.Mish,
               nn.Softplus, nn.Hardtanh, nn.ReLU6)


@dataclass(frozen=True)
class LinearPlan:
    """How one Linear is parallelized. ``after``: for a sharded-input layer, the layer -- or layers, e.g.
    ``("q_proj", "k_proj", "v_proj")`` or ``("gate_proj", "up_proj")`` -- whose sharded outputs it consumes.
    ``unit``: the features on the sharded side split over the grid only in whole units of this size (attention:
    ``head_dim``, so every rank holds whole heads). ``segments``: a fused layer's output segments, each split on
    its own (``axgrid.nn.Linear``'s ``out_segments``; sharded output only)."""

    transpose: bool = False
    input_layout: str = "replicated"
    output_layout: str = "replicated"
    after: Optional[Union[str, tuple[str, ...]]] = None
    unit: int = 1
    segments: tuple[int, ...] = ()

    @property
    def producers(self) -> tuple[str, ...]:
        """The names in ``after`` as a tuple (empty without one)."""
        return () if self.after is None else (self.after,) if isinstance(self.after, str) else tuple(self.after)


Plan = dict[str, LinearPlan]


def pair(up: Union[str, Sequence[str]], down: str, unit: int = 1) -> Plan:
    """Plan entries for normal layer(s) ``up`` whose outputs feed the transposed ``down`` through per-token ops:
    one producer (an MLP), or several that share the input and are combined elementwise (SwiGLU's gate and up)
    or per head (attention's q, k, v with ``unit=head_dim``). The first producer's width is ``down``'s input."""
    ups = (up,) if isinstance(up, str) else tuple(up)
    if not ups or down in ups:
        raise ValueError(f"pair({up!r}, {down!r}): give one or more producers, distinct from the consumer")
    if unit < 1:
        raise ValueError(f"pair(..., unit={unit}): unit must be >= 1 (the head size for attention, else 1)")
    plan = {u: LinearPlan(False, "replicated", "sharded", unit=unit) for u in ups}
    plan[down] = LinearPlan(True, "sharded", "replicated", after=ups if len(ups) > 1 else ups[0], unit=unit)
    return plan


def _divisible(lin: nn.Linear, grid: Grid, p: LinearPlan) -> Optional[str]:
    gi, go = (grid.size("y"), grid.size("x")) if p.transpose else (grid.size("x"), grid.size("y"))
    if lin.in_features % gi or lin.out_features % go:
        return (f"in_features={lin.in_features}/out_features={lin.out_features} not divisible by the grid's "
                f"{'Gy,Gx' if p.transpose else 'Gx,Gy'}=({gi},{go})")
    for side, f, g in (("in", lin.in_features, gi), ("out", lin.out_features, go)):
        if getattr(p, side + "put_layout") == "sharded" and (f // g) % p.unit:
            return (f"{side}_features={f} over {g} ranks is not a whole number of units of {p.unit} (heads of "
                    f"head_dim={p.unit}): the grid dimension must divide the head count {f // p.unit}")
    return None


def auto_plan(model: nn.Module, grid: Grid) -> Plan:
    """Pairs found in ``nn.Sequential`` containers: Linear, elementwise ops..., Linear (both divisible)."""
    plan: Plan = {}
    for name, mod in model.named_modules():
        if type(mod) is not nn.Sequential:      # a subclass may have its own forward: no assumptions
            continue
        children = list(mod.named_children())
        i = 0
        while i < len(children):
            cname, c = children[i]
            if type(c) is nn.Linear:
                j = i + 1
                while j < len(children) and isinstance(children[j][1], ELEMENTWISE):
                    j += 1
                if j < len(children) and type(children[j][1]) is nn.Linear:
                    up = f"{name}.{cname}" if name else cname
                    down = f"{name}.{children[j][0]}" if name else children[j][0]
                    cand = pair(up, down)
                    if all(_divisible(m, grid, cand[k]) is None for k, m in
                           ((up, c), (down, children[j][1]))):
                        plan.update(cand)
                        i = j + 1
                        continue
            i += 1
    return plan


def _check_pairs(plan: Plan, linears: dict[str, nn.Linear]) -> None:
    """Every sharded side has a partner with the matching layout, orientation and width (no silent mismatch)."""
    consumed = set()
    for name, p in plan.items():
        if p.input_layout != "sharded":
            continue
        if not p.producers or any(a not in linears or a not in plan for a in p.producers):
            raise ValueError(f"plan: {name} takes a sharded input, so it needs after=<the layer(s) producing it>; "
                             f"use axgrid.pair(up, down)")
        for a in p.producers:
            src = plan[a]
            if src.output_layout != "sharded" or src.transpose == p.transpose:
                raise ValueError(f"plan: {name} (transpose={p.transpose}) follows {a} (transpose={src.transpose}, "
                                 f"output {src.output_layout}): the producer must have a sharded output and the "
                                 f"opposite orientation")
        first = p.producers[0]
        if linears[first].out_features != linears[name].in_features:
            raise ValueError(f"plan: {first} gives {linears[first].out_features} features but {name} takes "
                             f"{linears[name].in_features}")
        consumed.update(p.producers)
    orphans = [n for n, p in plan.items() if p.output_layout == "sharded" and n not in consumed]
    if orphans:
        raise ValueError(f"plan: {orphans} produce sharded outputs that no layer takes (after=...); make them "
                         f"replicated or pair them")


def move_to_device(model: nn.Module, device: torch.device) -> nn.Module:
    """Move every parameter and buffer of ``model`` that is not on ``device`` there, in place (``Module.to`` would
    also touch what is there already). A parameter held by several modules, or parameters over the same memory
    (tied weights), stay one tensor; ``requires_grad`` and axgrid marks are kept. Tensors on the meta device (a
    model built without memory, filled by a loader later) stay."""
    moved: dict[object, torch.Tensor] = {}

    def key(t: torch.Tensor) -> object:
        if t.numel() == 0 or is_fake(t):       # a fake tensor (a dry run's) has no memory address: itself
            return id(t)
        try:
            return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        except (RuntimeError, NotImplementedError):
            return id(t)

    def placed(t: torch.Tensor, param: bool) -> torch.Tensor:
        k = key(t)
        if k not in moved:
            data = t.detach().to(device)
            if param:
                data = nn.Parameter(data, requires_grad=t.requires_grad)
                data.__dict__.update({n: v for n, v in t.__dict__.items() if n.startswith("axgrid_")})
            moved[k] = data
        return moved[k]

    for mod in model.modules():
        for table, param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(table.items()):
                if t is not None and t.device != device and t.device.type != "meta":
                    table[name] = placed(t, param)
    return model


def set_submodule(model: nn.Module, path: str, new: nn.Module) -> None:
    """Put ``new`` at the qualified ``path`` of ``model``."""
    parent = model.get_submodule(path.rsplit(".", 1)[0]) if "." in path else model
    setattr(parent, path.rsplit(".", 1)[-1], new)


def parallel_copy(lin: nn.Linear, grid: Grid, p: LinearPlan) -> Linear:
    """An ``axgrid.nn.Linear`` holding this rank's part of ``lin``'s weights, laid out as ``p`` says (frozen
    parameters stay frozen)."""
    made = Linear.from_dense(lin, grid, transpose=p.transpose, input_layout=p.input_layout,
                             output_layout=p.output_layout, out_segments=p.segments)
    for param, old in ((made.weight, lin.weight), (made.bias, lin.bias)):
        if param is not None:
            param.requires_grad_(old.requires_grad)
    return made


def use_torch_forwards(model: nn.Module) -> None:
    """Undo the Hub-kernel swap that ``transformers`` (5.25 on, with Hugging Face's ``kernels`` installed) applies in
    ``from_pretrained`` and again in every ``train()``/``eval()`` (``kernelize``: layer forwards replaced by kernels
    fetched from the Hub for the model's device). axgrid's plan owns the forwards of the layers it parallelizes, a
    compute node may have no network, and on a device the CPU build does not have (the dry run's fake GPU) the swap
    itself fails. ``model.reset_kernels()`` puts the torch forwards back and stops the re-kernelization."""
    if getattr(model, "use_kernels", False) and callable(getattr(model, "reset_kernels", None)):
        model.reset_kernels()


def parallelize(model: nn.Module, grid: Grid, plan: "Optional[Plan | TransformerPlan]" = None,
                auto_pair: bool = True, *, summary: bool = False) -> nn.Module:
    """Parallelize ``model`` in place on ``grid`` and return it.

    Without ``plan``, a model :mod:`axgrid.plans` recognises (Hugging Face Llama, Mistral, Qwen2, Qwen3, Gemma 3,
    Phi-3; tied embeddings included) gets its built-in :class:`~axgrid.plans.TransformerPlan`: the residual stream
    sharded like axgrid's GPT, attention on local heads, no redistribution between layers; when its sizes do not
    divide the grid a ValueError names the grids that fit (``plan={}`` runs it drop-in). Another Hugging Face
    model runs drop-in with a warning. A ``TransformerPlan`` is applied as given.

    Otherwise ``model``'s ``nn.Linear`` modules are replaced by ``axgrid.nn.Linear`` with the same weights:
    ``plan`` maps qualified module names to :class:`LinearPlan`; names not in it are drop-in (replicated in and
    out, normal); ``plan={}`` asks for that alone. With ``auto_pair`` the pairs of :func:`auto_plan` are added for
    names the plan does not mention.

    Left dense, with a warning: a Linear whose features do not divide the grid, a Linear whose weight is tied
    to another module (see :mod:`axgrid.plans.ties`), and matmul-like modules that are not ``nn.Linear`` (HF
    ``Conv1D``). ``model.axgrid_summary`` lists what became parallel and what stayed dense and why
    (``summary=True`` also prints it on rank 0). The parallel model's ``save_pretrained`` refuses; use
    :func:`axgrid.export_pretrained` / :func:`axgrid.to_dense`.

    A Hugging Face model that ``transformers`` kernelized (Hub kernels in place of layer forwards, the default of its
    ``from_pretrained`` from 5.25 on) gets its torch forwards back first (:func:`use_torch_forwards`).
    """
    use_torch_forwards(model)
    if not isinstance(plan, dict):
        from . import apply_plan, builtin_plan
        whole = plan if plan is not None else builtin_plan(model, grid)
        if whole is not None:
            apply_plan(model, grid, whole)
            move_to_device(model, grid.device)
            report(model, grid.rank, {}, {}, summary)
            guard_save_pretrained(model)
            return model
    full: Plan = dict(auto_plan(model, grid)) if auto_pair else {}
    full.update(plan or {})
    paths: dict[int, list[str]] = {}          # a Linear used at several paths is replaced at every one
    for n, m in model.named_modules(remove_duplicate=False):
        if type(m) is nn.Linear:
            paths.setdefault(id(m), []).append(n)
    linears = {n: m for n, m in model.named_modules() if type(m) is nn.Linear}
    unknown = set(plan or {}) - {n for ns in paths.values() for n in ns}
    if unknown:
        raise ValueError(f"plan names {sorted(unknown)} that are not nn.Linear modules of the model; "
                         f"its Linear modules are {sorted(linears)}")
    shared = [ns for ns in paths.values() if len(ns) > 1]
    if any(full.get(n, LinearPlan()).input_layout == "sharded" or full.get(n, LinearPlan()).output_layout ==
           "sharded" for ns in shared for n in ns):
        raise ValueError(f"a Linear used at several paths ({shared}) cannot be part of a sharded pair; "
                         f"leave it drop-in")
    _check_pairs(full, linears)
    tied = tied_linears(model, linears)
    dense_left = dict(tied)
    for name, lin in linears.items():
        if name in tied:
            continue
        p = full.get(name, LinearPlan())
        why = _divisible(lin, grid, p)
        if why:
            warnings.warn(f"axgrid.parallelize: {name} left dense: {why}", stacklevel=2)
            dense_left[name] = why
    # a pair whose partner stays dense falls back to drop-in on every side
    for name, p in list(full.items()):
        if p.producers and any(n in dense_left for n in (name, *p.producers)):
            for n in (name, *p.producers):
                full[n] = LinearPlan(full[n].transpose)
    made: dict[str, Linear] = {}
    for name, lin in linears.items():
        if name in dense_left:
            continue
        made[name] = parallel_copy(lin, grid, full.get(name, LinearPlan()))
        for path in paths[id(lin)]:
            set_submodule(model, path, made[name])
    for name, layer in made.items():
        p = full.get(name, LinearPlan())
        if p.producers:
            layer.pair_after(made[p.producers[0]])
    move_to_device(model, grid.device)
    report(model, grid.rank, dense_left, tied, summary)
    guard_save_pretrained(model)
    return model
