"""What the peers train: the workloads (an MLP stack or axgrid's GPT, the same weights everywhere) and the axgrid
grids that run side by side in one process."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

import axgrid
from axgrid.core.grid import Grid
from axgrid.launch.env import detect_launch
from axgrid.models import MLPStack
from axgrid.models.gpt import GPT, GPTConfig
from axgrid.spec import TransformerShape
from axgrid.device import choose_device, of
from axgrid.core.runtime import build_grid
from axgrid.spec.layout import GridShape, RankLayout, all_shapes


@dataclass(frozen=True)
class Workload:
    """``kind`` "mlp" (``hidden``, ``depth``, ``tokens``) or "gpt" (``gpt`` config, ``batch`` sequences)."""

    kind: str
    hidden: int
    depth: int = 1
    tokens: int = 2048
    gpt: Optional[GPTConfig] = None
    batch: int = 8
    lr: float = 1e-2
    seed: int = 0

    def describe(self) -> str:
        if self.kind == "mlp":
            return (f"MLP block(s) {self.hidden}->{4 * self.hidden}->{self.hidden} GELU + residual, depth "
                    f"{self.depth}, {self.tokens} tokens, fp32, SGD")
        c = self.gpt.shape
        return (f"GPT layers {c.layers} hidden {c.hidden} heads {c.heads} seq {c.seq} vocab {c.vocab}, batch "
                f"{self.batch} ({self.batch * c.seq} tokens), fp32, SGD")

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch, the same on every rank: mlp ``x [tokens, h]`` (and a dummy); gpt ``tokens, targets``."""
        gen = torch.Generator().manual_seed(self.seed + 12345)
        if self.kind == "mlp":
            return torch.randn(self.tokens, self.hidden, generator=gen), torch.empty(0)
        win = torch.randint(0, self.gpt.shape.vocab, (self.batch, self.gpt.shape.seq + 1), generator=gen)
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()

    def rows(self) -> int:
        """Rows of the batch that data parallelism splits (tokens, or sequences)."""
        return self.tokens if self.kind == "mlp" else self.batch

    def serial(self) -> nn.Module:
        return MLPStack(self.hidden, self.depth, grid=None, seed=self.seed) if self.kind == "mlp" \
            else GPT(self.gpt, None)

    def grid_fits(self, s: GridShape) -> bool:
        if self.kind == "mlp":
            f = 4 * self.hidden
            sizes = [(self.hidden, s.gx), (self.hidden, s.gy), (f, s.gx), (f, s.gy)]
            return all(v % g == 0 for v, g in sizes) and self.tokens % (s.gd * s.gz) == 0
        c = self.gpt.shape
        sizes = [(c.hidden, s.gx), (c.hidden, s.gy), (c.heads, s.gy), (c.ffn, s.gx), (c.ffn, s.gy), (c.vocab, s.gy)]
        return all(v % g == 0 for v, g in sizes) and self.batch % (s.gd * s.gz) == 0

    def tp_fits(self, tp: int) -> bool:
        if self.kind == "mlp":
            return (4 * self.hidden) % tp == 0
        c = self.gpt.shape
        return c.heads % tp == 0 and c.ffn % tp == 0 and c.vocab % tp == 0 and c.hidden % tp == 0


def mlp_loss(y: torch.Tensor) -> torch.Tensor:
    return y.pow(2).mean()


def side_grid(spec: str, overlap: axgrid.OverlapConfig, timeout_s: float, record_timing: bool = False,
              trace: bool = False) -> Grid:
    """An axgrid grid over the already-initialised default group, allowed to coexist with other grids."""
    world = dist.get_world_size()
    shape = GridShape.parse(spec, world)
    launch = replace(detect_launch(use_mpi=False), rank=dist.get_rank(), world_size=world, launcher="existing")
    cfg = axgrid.RuntimeConfig(timeout_s=timeout_s, overlap=overlap, seed=0, record_timing=record_timing,
                               trace=trace)
    dev = of(choose_device(launch, dist.get_backend(), joining=True))
    return build_grid(RankLayout(shape, "xyzd"), launch, dist.get_backend(), cfg, False, ["local"] * world, 0, dev)


def candidate_grids(w: Workload, world: int) -> list[str]:
    return [str(s) for s in all_shapes(world) if w.grid_fits(s)]


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The options that size the workloads (the same in every script that trains them)."""
    ap.add_argument("--hidden", type=int, default=512, help="MLP and GPT width")
    ap.add_argument("--depth", type=int, default=1, help="MLP blocks")
    ap.add_argument("--tokens", type=int, default=2048, help="MLP tokens per step (global)")
    ap.add_argument("--layers", type=int, default=2, help="GPT layers")
    ap.add_argument("--heads", type=int, default=8, help="GPT heads")
    ap.add_argument("--seq", type=int, default=256, help="GPT sequence length")
    ap.add_argument("--vocab", type=int, default=512, help="GPT vocabulary")
    ap.add_argument("--batch", type=int, default=8, help="GPT sequences per step (global)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)


def workload_from_args(kind: str, a: argparse.Namespace) -> Workload:
    """The ``kind`` ("mlp" or "gpt") workload sized by :func:`add_workload_args`'s options."""
    if kind == "mlp":
        return Workload("mlp", a.hidden, a.depth, a.tokens, lr=a.lr, seed=a.seed)
    cfg = GPTConfig(TransformerShape("bench", a.layers, a.hidden, a.heads, a.seq, a.vocab), seed=a.seed)
    return Workload("gpt", a.hidden, gpt=cfg, batch=a.batch, lr=a.lr, seed=a.seed)
