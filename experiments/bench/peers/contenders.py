"""Each contender: one training configuration behind the same interface (:class:`Contender`): axgrid on a grid, and
PyTorch's DTensor 1-D TP, DTensor 2-D TP x DP, DDP and FSDP2."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import axgrid
from axgrid.models import MLPStack
from axgrid.models.gpt import GPT
from axgrid.train import train_step

from .comm_bytes import byte_comm_mode
from .workload import Workload, mlp_loss, side_grid


class Contender:
    """One training configuration. Subclasses set ``model``, ``opt``, and implement ``_loss``/``_sync``."""

    name: str = ""
    family: str = ""

    def __init__(self, w: Workload, dp_size: int, dp_index: int) -> None:
        self.w = w
        x, y = w.data()
        per = w.rows() // dp_size
        self.x, self.y = x[dp_index * per:(dp_index + 1) * per], y[dp_index * per:(dp_index + 1) * per]
        self.dp_size = dp_size

    def _loss(self) -> torch.Tensor:
        """This rank's loss on its slice (what its backward starts from)."""
        raise NotImplementedError

    def _sync(self) -> None:
        """Gradient synchronisation after backward, when the contender needs an explicit one."""

    def _dp_mean(self, v: float) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self._backward(self._loss())
        self._sync()
        self.opt.step()

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def loss(self) -> float:
        with torch.no_grad():
            v = self._loss()
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        return self._dp_mean(float(v))

    def count_bytes(self) -> tuple[int, str]:
        """Run one step counting what it communicates; ``(bytes, how counted)``."""
        mode = byte_comm_mode()
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.step()
        return int(sum(mode.bytes.values())), "CommDebugMode"

    def close(self) -> None:
        pass


def _world_mean(v: float, group=None) -> float:
    t = torch.tensor([v], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return float(t[0]) / dist.get_world_size(group)


# ---------------------------------------------------------------------------------------------------------
# axgrid
# ---------------------------------------------------------------------------------------------------------
class AxgridContender(Contender):
    family = "axgrid"

    def __init__(self, w: Workload, spec: str, overlap: axgrid.OverlapConfig, timeout_s: float) -> None:
        self.grid = side_grid(spec, overlap, timeout_s)
        super().__init__(w, self.grid.size("d"), self.grid.coord.d)
        self.name = f"axgrid {self.grid.shape}"
        self.model = MLPStack(w.hidden, w.depth, grid=self.grid, seed=w.seed) if w.kind == "mlp" \
            else GPT(w.gpt, self.grid)
        self.grid.watch(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=w.lr)

    def _loss(self) -> torch.Tensor:
        return mlp_loss(self.model(self.x)) if self.w.kind == "mlp" else self.model(self.x, self.y)

    def step(self) -> None:
        train_step(self.model, self.opt, lambda _: self._loss(), self.grid)

    def _dp_mean(self, v: float) -> float:
        return float(self.grid.comm.all_reduce(torch.tensor([v], dtype=torch.float64), "d", average=True)[0])

    def count_bytes(self) -> tuple[int, str]:
        self.grid.ledger.reset()
        self.step()
        n = sum(e.bytes for e in self.grid.ledger.entries.values())
        self.grid.ledger.reset()
        return n, "ledger"

    def close(self) -> None:
        self.grid.destroy()


# ---------------------------------------------------------------------------------------------------------
# PyTorch peers
# ---------------------------------------------------------------------------------------------------------
def _tp_plan(w: Workload, model: nn.Module) -> dict[str, Any]:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    if w.kind == "mlp":
        plan: dict[str, Any] = {}
        for i in range(w.depth):
            plan.update({f"ups.{i}": ColwiseParallel(), f"downs.{i}": RowwiseParallel()})
        return plan
    plan = {"head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(w.gpt.shape.layers):
        plan.update({f"blocks.{i}.qkv": ColwiseParallel(), f"blocks.{i}.proj": RowwiseParallel(),
                     f"blocks.{i}.up": ColwiseParallel(), f"blocks.{i}.down": RowwiseParallel()})
    return plan


class DTensorGPTLoss(nn.Module):
    """The GPT forward on TP-parallelised modules ending in PyTorch's vocabulary-parallel cross entropy:
    ``forward(tokens [B, S], targets [B, S])`` -> scalar loss (a replicated DTensor)."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor.parallel import loss_parallel
        m = self.model
        b, s = tokens.shape
        pos = torch.arange(s, device=tokens.device).repeat(b)
        x = m.wte(tokens.reshape(-1)) + m.wpe(pos)                 # [B*S, h], replicated
        for blk in m.blocks:
            x = blk(x, b, s)
        logits = m.head(m.ln_f(x))                                 # DTensor [B*S, V], sharded over the vocabulary
        with loss_parallel():
            return F.cross_entropy(logits.float(), targets.reshape(-1))


class DTensorContender(Contender):
    """DTensor TP over ``tp`` ranks; with ``dp > 1`` a 2-D mesh (dp, tp), the batch split over dp and the
    gradients averaged over dp in one flat all-reduce per step."""

    family = "DTensor"

    def __init__(self, w: Workload, tp: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module
        world = dist.get_world_size()
        dp = world // tp
        if dp == 1:
            mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
            self.dp_group, dp_index = None, 0
            self.name = f"DTensor 1D TP{tp}"
        else:
            mesh2 = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
            mesh = mesh2["tp"]
            self.dp_group, dp_index = mesh2.get_group("dp"), mesh2.get_local_rank("dp")
            self.name = f"DTensor 2D TP{tp}xDP{dp}"
        super().__init__(w, dp, dp_index)
        model = w.serial()
        parallelize_module(model, mesh, _tp_plan(w, model))
        if w.kind == "gpt":
            for blk in model.blocks:                 # each rank computes heads/tp whole heads (QKV rows head-major)
                blk.heads_local = w.gpt.shape.heads // tp
            self.net: nn.Module = DTensorGPTLoss(model)
        else:
            self.net = model
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=w.lr)

    def _loss(self) -> torch.Tensor:
        return mlp_loss(self.net(self.x)) if self.w.kind == "mlp" else self.net(self.x, self.y)

    def _backward(self, loss: torch.Tensor) -> None:
        if self.w.kind == "gpt":
            from torch.distributed.tensor.parallel import loss_parallel
            with loss_parallel():
                loss.backward()
        else:
            loss.backward()

    def _sync(self) -> None:
        if self.dp_group is None:
            return
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                 for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_group)
        flat.div_(self.dp_size)
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def _dp_mean(self, v: float) -> float:
        return v if self.dp_group is None else _world_mean(v, self.dp_group)


class DDPContender(Contender):
    family = "DDP"

    def __init__(self, w: Workload) -> None:
        from torch.nn.parallel import DistributedDataParallel
        super().__init__(w, dist.get_world_size(), dist.get_rank())
        self.name = "DDP"
        self.model = DistributedDataParallel(w.serial())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=w.lr)

    def _loss(self) -> torch.Tensor:
        return mlp_loss(self.model(self.x)) if self.w.kind == "mlp" else self.model(self.x, self.y)

    def _dp_mean(self, v: float) -> float:
        return _world_mean(v)


class FSDP2Contender(Contender):
    family = "FSDP2"

    def __init__(self, w: Workload) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        super().__init__(w, dist.get_world_size(), dist.get_rank())
        self.name = "FSDP2"
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        model = w.serial()
        units = [*model.ups, *model.downs] if w.kind == "mlp" else list(model.blocks)
        for m in units:
            fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=w.lr)

    def _loss(self) -> torch.Tensor:
        return mlp_loss(self.model(self.x)) if self.w.kind == "mlp" else self.model(self.x, self.y)

    def _dp_mean(self, v: float) -> float:
        return _world_mean(v)


def build_peers(w: Workload, skip: set[str], log: Callable[[str], None]) -> list[Contender]:
    """PyTorch's contenders for this workload and world size (those that cannot run here are reported)."""
    world = dist.get_world_size()
    out: list[Contender] = []
    makers: list[tuple[str, Callable[[], Contender]]] = []
    if w.tp_fits(world):
        makers.append(("dtensor1d", lambda: DTensorContender(w, world)))
    for tp in range(2, world):
        if world % tp == 0 and w.tp_fits(tp) and w.rows() % (world // tp) == 0:
            makers.append(("dtensor2d", lambda tp=tp: DTensorContender(w, tp)))
    if w.rows() % world == 0:
        makers += [("ddp", lambda: DDPContender(w)), ("fsdp2", lambda: FSDP2Contender(w))]
    for key, make in makers:
        if key in skip:
            continue
        try:
            out.append(make())
        except Exception as e:  # a peer that does not run on this backend/torch: say so, keep the rest
            log(f"peer {key} unavailable here: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return out
