"""Train one small model two ways on the same gloo ranks and compare the parameters after every step: under axgrid
(its parallel ``Linear`` on the grid, its data-parallel buckets, ``zero`` and every overlap) and under PyTorch's
``DistributedDataParallel(find_unused_parameters=True)`` over the grid's d-groups with the same torch optimizer --
a reference we did not write. Shared by the generated differential test and its named regression cases.

A model is built from a :class:`Recipe` (which of the training patterns DDP handles it holds) and trained by a
:class:`Schedule` (micro-batches, ``no_sync``, which ``zero_grad``, clipping, which d-ranks take the branch). The
training loop is written once, for both: what differs is only the wrapper (DDP or axgrid), its ``no_sync``, the
clipping function and the optimizer (sharded over d with ``zero`` >= 1). With axgrid no ``sync_gradients`` is
called: the gradients must be reduced by the end of every backward outside ``no_sync``, as DDP's are.
"""
from __future__ import annotations

import copy
import gc
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

WIDTH, HIDDEN, ROWS = 6, 8, 4            # features in/out, hidden, rows per d-rank per micro-batch
PARALLEL = ("inp", "twice", "branch", "frozen", "unused", "out")   # nn.Linear -> axgrid.nn.Linear
BUCKET_BYTES = 512                       # several buckets per model
# with a bf16 Linear (``Recipe.mixed``) the two sides round its gradients differently -- DDP sums bf16 in bf16 and
# divides first, axgrid reduces in fp32 (``grad_reduce_dtype``) -- so a bf16 weight may end one of its ulps apart
# (2^-9..2^-7 of its value; measured: 0.00195 on weights of 0.36 after 3 steps), and the difference travels through
# the next forwards into every parameter. The patterns that went wrong moved parameters by 5e-3 and more; without
# bf16 they are checked at 1e-5 (measured: at most 1.2e-7 over every zero mode and overlap).
MIXED_TOL = 4e-3


@dataclass(frozen=True)
class Recipe:
    """What the model holds besides ``inp -> tanh -> LayerNorm -> out``: ``twice`` a Linear called twice in one
    forward; ``branch`` a Linear only some d-ranks call (``Schedule.branch``); ``frozen`` a Linear without
    gradients; ``unused`` a Linear no rank calls; ``tied`` one dense matrix read twice (``h @ T``, later
    ``h @ T.t()``); ``mixed`` a dense bf16 Linear; ``groups`` two optimizer groups with different weight decay."""
    twice: bool = False
    branch: bool = False
    frozen: bool = False
    unused: bool = False
    tied: bool = False
    mixed: bool = False
    groups: bool = False
    seed: int = 0


@dataclass(frozen=True)
class Step:
    """One optimizer step: ``micro`` forward+backward passes (all but the last under ``no_sync`` when ``no_sync``,
    else each reduced), ``zero_grad`` first (``"model"``: ``model.zero_grad()``, ``"opt"``: the optimizer's),
    ``clip`` > 0 clips the global norm, ``branch[d]``: whether d-rank d calls the branch."""
    micro: int = 1
    no_sync: bool = True
    zero_grad: str = "opt"
    clip: float = 0.0
    branch: tuple[bool, ...] = (True, True)


@dataclass(frozen=True)
class Case:
    grid: str
    zero: int
    overlap: str
    recipe: Recipe
    steps: tuple[Step, ...] = field(default_factory=lambda: (Step(),) * 3)
    lr: float = 0.05
    weight_decay: float = 0.3

    @property
    def eps(self) -> float:
        """AdamW's eps. Its update ``lr·m/(sqrt(v) + eps)`` is ``±lr`` for any gradient element well above eps, so
        two summation orders of a near-zero element (rounding: 1e-7 of the gradients in fp32, 2^-8 through a bf16
        layer) can move it ``2·lr`` apart. A larger eps keeps the comparison well conditioned -- the update then
        follows the gradient's size -- while decay, moments and skipping stay AdamW's."""
        return 1.0 if self.recipe.mixed else 1e-2


class Net(nn.Module):
    def __init__(self, r: Recipe) -> None:
        super().__init__()
        torch.manual_seed(r.seed)
        self.r = r
        self.inp = nn.Linear(WIDTH, HIDDEN)
        if r.twice:
            self.twice = nn.Linear(HIDDEN, HIDDEN)
        if r.branch:
            self.branch = nn.Linear(HIDDEN, HIDDEN)
        if r.frozen:
            self.frozen = nn.Linear(HIDDEN, HIDDEN)
        if r.unused:
            self.unused = nn.Linear(HIDDEN, HIDDEN)
        if r.tied:
            self.tied = nn.Parameter(torch.randn(HIDDEN, HIDDEN) * 0.3)
        if r.mixed:
            self.low = nn.Linear(HIDDEN, HIDDEN, dtype=torch.bfloat16)
        self.norm = nn.LayerNorm(HIDDEN)
        self.out = nn.Linear(HIDDEN, WIDTH)
        if r.frozen:
            self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor, use_branch: bool) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        if self.r.twice:
            h = torch.tanh(self.twice(torch.tanh(self.twice(h))))
        if self.r.branch and use_branch:
            h = h + torch.tanh(self.branch(h))
        if self.r.frozen:
            h = h + self.frozen(h)
        if self.r.tied:
            h = torch.tanh(h @ self.tied) @ self.tied.t()
        if self.r.mixed:
            h = h + self.low(h.to(torch.bfloat16)).float()
        return self.out(self.norm(h))


def _groups(model: nn.Module, case: Case) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not case.recipe.groups:
        return [{"params": params, "weight_decay": case.weight_decay}]
    vec = {id(p) for n, p in model.named_parameters() if n.endswith("bias") or n.startswith("norm")}
    return [{"params": [p for p in params if id(p) not in vec], "weight_decay": case.weight_decay},
            {"params": [p for p in params if id(p) in vec], "weight_decay": 0.0}]


def _batch(case: Case, step: int, micro: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(hash((case.recipe.seed, step, micro, d)) & 0x7FFFFFFF)
    return torch.randn(ROWS, WIDTH, generator=gen), torch.randn(ROWS, WIDTH, generator=gen)


def _train_step(model: nn.Module, net: Net, opt, no_sync, clip, case: Case, s: int, d: int) -> None:
    st = case.steps[s]
    if st.zero_grad == "model":
        net.zero_grad()
    else:
        opt.zero_grad()
    for m in range(st.micro):
        x, y = _batch(case, s, m, d)
        quiet = st.no_sync and m < st.micro - 1
        with no_sync() if quiet else nullcontext():
            loss = (model(x, st.branch[d]) - y).square().sum(-1).mean() / st.micro
            loss.backward()
    if st.clip > 0:
        clip(st.clip)
    opt.step()


def _dense_params(net: Net) -> dict[str, torch.Tensor]:
    """Every parameter as its dense tensor (axgrid's Linear gathered over the grid: collective)."""
    import axgrid
    out = {name: p.detach() for name, p in net.named_parameters() if name.split(".")[0] not in PARALLEL}
    for name in PARALLEL:
        mod = getattr(net, name, None)
        if isinstance(mod, axgrid.nn.Linear):
            mod = mod.to_dense()
        if mod is not None:
            out[f"{name}.weight"], out[f"{name}.bias"] = mod.weight.detach(), mod.bias.detach()
    return out


def differences(case: Case, timeout_s: float = 30.0) -> list[tuple[int, str, float, float]]:
    """On one rank of the grid's world: train ``case`` under DDP and under axgrid; ``(step, parameter,
    max|axgrid - DDP|, max|DDP|)`` for every parameter after every step."""
    import axgrid
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    config = axgrid.RuntimeConfig(timeout_s=timeout_s, overlap=axgrid.OverlapConfig.parse(case.overlap),
                                  zero=case.zero, bucket_bytes=BUCKET_BYTES, seed=0)
    grid = axgrid.init(case.grid, config=config)
    ddp = None
    try:
        d = grid.coord.d
        ref = Net(case.recipe)
        par = copy.deepcopy(ref)
        for name in PARALLEL:
            dense = getattr(par, name, None)
            if dense is not None:
                layer = axgrid.nn.Linear.from_dense(dense, grid)
                layer.requires_grad_(dense.weight.requires_grad)
                setattr(par, name, layer)
        ddp = DDP(ref, process_group=grid.comm.groups["d"], find_unused_parameters=True,
                  bucket_cap_mb=BUCKET_BYTES / 2**20)
        ref_opt = torch.optim.AdamW(_groups(ref, case), lr=case.lr, eps=case.eps, foreach=False)
        grid.watch(par)
        par_opt = axgrid.shard_optimizer(torch.optim.AdamW(_groups(par, case), lr=case.lr, eps=case.eps, foreach=False),
                                         par, grid)
        out = []
        for s in range(len(case.steps)):
            _train_step(ddp, ref, ref_opt, ddp.no_sync,
                        lambda c: torch.nn.utils.clip_grad_norm_(ref.parameters(), c), case, s, d)
            _train_step(par, par, par_opt, grid.no_sync, lambda c: axgrid.clip_grad_norm_(par, c, grid), case, s, d)
            axgrid.finish_gradients(grid)       # zero >= 1 with ODP: the parameters' all-gathers land first
            want, got = _dense_params(ref), _dense_params(par)
            out += [(s, name, (got[name].float() - w.float()).abs().max().item(), w.float().abs().max().item())
                    for name, w in want.items()]
        return out
    finally:
        del ddp                   # DDP's reducer holds the d-group: gone before the grid releases the groups
        gc.collect()
        grid.destroy()


def compare_with_ddp(case: Case, timeout_s: float = 30.0) -> list[str]:
    """The mismatches of :func:`differences`, one line each (empty when every parameter agrees after every step:
    within 1e-5 times (1 + its largest magnitude), or with a bf16 Linear ``MIXED_TOL`` times that)."""
    tol = MIXED_TOL if case.recipe.mixed else 1e-5
    return [f"step {s} {name}: max|axgrid - DDP| {err:.3g}" for s, name, err, size in differences(case, timeout_s)
            if err > tol * (1 + size)]
