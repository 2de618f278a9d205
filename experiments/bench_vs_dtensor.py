"""Side by side: the same GPT trained with PyTorch's own tensor parallelism (DTensor) and with axgrid.

    axgrid launch -n 4 -- python experiments/bench_vs_dtensor.py --model gpt-tiny --heads 8 --steps 6
    axgrid launch -n 8 -- python experiments/bench_vs_dtensor.py --model gpt-tiny --heads 8 --steps 6

Both sides train the same model (same sizes, the same initial weights, the same batches, AdamW with the same
settings, fp32 on CPU / bf16 autocast on GPU) for the same steps, in one run:

- **DTensor**: the serial ``axgrid.models.GPT(config, None)`` on every rank, parallelised over a 1-D device mesh
  of all ranks with ``torch.distributed.tensor.parallel`` in the Megatron-style layout -- QKV and MLP-up
  ``ColwiseParallel``, attention-out and MLP-down ``RowwiseParallel``, the LM head ``ColwiseParallel`` with its
  output left sharded over the vocabulary and the loss computed under ``loss_parallel()`` (no rank holds full
  logits, as in axgrid); embeddings and layer norms replicated. Every rank sees the whole batch (pure tensor
  parallelism: heads must be divisible by the number of ranks).
- **axgrid**: ``GPT(config, grid)`` on its best grid: by default a quick measured sweep (``--quick-steps`` steps
  on every grid the model fits, or only the perf model's top ``--top-k`` with ``--machine``), the winner then
  re-measured for ``--steps`` steps; or a grid given with ``--grid``.

Printed (rank 0): time per step of each (mean after ``--warmup`` steps), the ratio, the loss of each (they start
equal: a check that both compute the same thing), and the bytes communicated per step on rank 0: axgrid from its
ledger, DTensor from ``torch.distributed.tensor.debug.CommDebugMode`` (collective counts) extended here to add
up each collective's buffer size -- one extra, untimed step runs under it. Bytes use the ledger's convention: the
all-reduced tensor, the all-gather's output, the reduce-scatter's input; "wire" is what one rank sends in a ring.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import defaultdict
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import axgrid  # noqa: E402
from axgrid.launch import detect_launch, init_distributed  # noqa: E402
from axgrid.layout import GridShape, all_shapes  # noqa: E402
from axgrid.models.gpt import GPT, GPTConfig, NAMED_SIZES  # noqa: E402


# ---------------------------------------------------------------------------------------------------------
# data and the shared step loop
# ---------------------------------------------------------------------------------------------------------
def batch_of(step: int, batch: int, cfg: GPTConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: ``[batch, seq]`` inputs and targets (uniform token ids), same on all ranks."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    win = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), generator=gen)
    return win[:, :-1], win[:, 1:]


def timed_steps(step_fn: Callable[[int], float], steps: int, warmup: int, sync: Callable[[], None]
                ) -> tuple[float, list[float]]:
    """Run ``warmup + steps`` steps; returns the mean seconds per timed step and every step's loss."""
    losses, times = [], []
    for s in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        losses.append(step_fn(s))
        sync()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return sum(times) / len(times), losses


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _autocast(device: torch.device, bf16: bool):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)


# ---------------------------------------------------------------------------------------------------------
# axgrid side
# ---------------------------------------------------------------------------------------------------------
def grid_fits(cfg: GPTConfig, s: GridShape, batch: int) -> bool:
    for value, g in ((cfg.hidden, s.gx), (cfg.hidden, s.gy), (cfg.heads, s.gy), (cfg.ffn, s.gx), (cfg.ffn, s.gy),
                     (cfg.vocab, s.gy)):
        if value % g:
            return False
    return batch % (s.gd * s.gz) == 0


def run_axgrid(cfg: GPTConfig, spec: str, a: argparse.Namespace, steps: int, warmup: int
               ) -> dict[str, Any]:
    """Train ``steps`` (+warm-up) steps on grid ``spec``; time per step, losses, rank 0's ledger per step."""
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=a.timeout, seed=a.seed))
    try:
        model = GPT(cfg, grid)
        opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=a.lr)
        gd, d = grid.size("d"), grid.coord.d
        per = a.batch // gd

        def step(s: int) -> float:
            x, y = batch_of(s, a.batch, cfg, a.seed)
            x, y = x[d * per:(d + 1) * per].to(grid.device), y[d * per:(d + 1) * per].to(grid.device)
            opt.zero_grad(set_to_none=True)
            with _autocast(grid.device, a.bf16):
                loss = model(x, y)
            loss.backward()
            axgrid.sync_gradients(model, grid)
            opt.step()
            return float(loss.detach())

        step(0)                                       # one step outside the ledger (allocations, first use)
        grid.ledger.reset()
        step(1)
        ledger = grid.ledger.snapshot()
        t, losses = timed_steps(step, steps, warmup, _sync)
        # the loss of the whole batch: the mean over the data-parallel ranks (logging only)
        mean = [float(grid.comm.all_reduce(torch.tensor([v], device=grid.device), "d", average=True)[0])
                for v in losses]
        return {"grid": spec, "time_s": t, "losses": mean,
                "bytes": sum(e.bytes for e in ledger.values()),
                "wire": sum(e.wire_bytes for e in ledger.values()),
                "calls": sum(e.calls for e in ledger.values()),
                "by_dim": axgrid.Ledger(ledger).bytes_by_dim()}
    finally:
        grid.destroy()


def candidate_grids(cfg: GPTConfig, world: int, a: argparse.Namespace) -> list[str]:
    fits = [s for s in all_shapes(world) if grid_fits(cfg, s, a.batch)]
    if a.machine and a.top_k:
        try:
            import perfmodel as pm
            from perfmodel.spec import TransformerSpec
            spec = TransformerSpec("bench", cfg.layers, cfg.hidden, cfg.heads, seq=cfg.seq, vocab=cfg.vocab)
            rk = pm.rank(pm.Problem(spec, a.batch, world, "bf16" if a.bf16 else "fp32"), pm.load_machine(a.machine))
            ranked = [r.grid_str for r in rk.feasible]
            ok = {str(s) for s in fits}
            top = [g for g in ranked if g in ok][: a.top_k]
            if top:
                return top
        except Exception as e:  # the perf model is optional here: fall back to measuring every grid
            if dist.get_rank() == 0:
                print(f"bench: perf model ranking unavailable ({type(e).__name__}: {e}); measuring every grid")
    return [str(s) for s in fits]


# ---------------------------------------------------------------------------------------------------------
# DTensor side
# ---------------------------------------------------------------------------------------------------------
def _comm_mode_with_bytes():
    """CommDebugMode that also adds up each collective's buffer bytes (ledger convention) and ring wire bytes."""
    from torch.distributed.tensor.debug import CommDebugMode
    try:
        from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops
    except ImportError:
        c10d_collective_ops = set()

    class ByteCommMode(CommDebugMode):
        def __init__(self, world: int) -> None:
            super().__init__()
            self.world = world
            self.bytes: dict[str, int] = defaultdict(int)
            self.wire: float = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
                return out
            pkt = func._overloadpacket
            if pkt in self.comm_registry or pkt in c10d_collective_ops:
                name = str(pkt).split(".")[-1]
                t = next((x for x in args if isinstance(x, torch.Tensor)), None)
                if t is None and args and isinstance(args[0], (list, tuple)):
                    t = next((x for x in args[0] if isinstance(x, torch.Tensor)), None)
                if t is not None:
                    n = t.numel() * t.element_size()
                    p = self.world
                    if "all_gather" in name or "allgather" in name:
                        n *= p                                   # the gathered output
                    self.bytes[name] += n
                    self.wire += (2 * (p - 1) / p if "all_reduce" in name or "allreduce" in name
                                  else (p - 1) / p) * n
            return out

    return ByteCommMode


def build_dtensor_model(cfg: GPTConfig, world: int, device: torch.device):
    """The serial GPT, parallelised Megatron-style over a 1-D mesh of all ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = GPT(cfg, None).to(device)
    mesh = init_device_mesh(device.type, (world,))
    plan: dict[str, Any] = {"head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(cfg.layers):
        plan.update({f"blocks.{i}.qkv": ColwiseParallel(), f"blocks.{i}.proj": RowwiseParallel(),
                     f"blocks.{i}.up": ColwiseParallel(), f"blocks.{i}.down": RowwiseParallel()})
    parallelize_module(model, mesh, plan)
    for blk in model.blocks:          # each rank now computes heads/world whole heads (QKV rows are head-major)
        blk.heads_local = cfg.heads // world
    return model


class DTensorGPTLoss(torch.nn.Module):
    """The GPT forward on the TP-parallelised modules, ending in PyTorch's vocabulary-parallel cross entropy.

    A module (not a function) so that CommDebugMode's module tracker sees a root module around the calls.
    ``forward(tokens [B, S], targets [B, S])`` -> scalar loss (a replicated DTensor).
    """

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


def run_dtensor(cfg: GPTConfig, a: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import loss_parallel
    world = dist.get_world_size()
    model = build_dtensor_model(cfg, world, device)
    opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=a.lr)
    net = DTensorGPTLoss(model)

    def step(s: int) -> float:
        x, y = batch_of(s, a.batch, cfg, a.seed)
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        with _autocast(device, a.bf16):
            loss = net(x, y)
        with loss_parallel():
            loss.backward()
        opt.step()
        return float(loss.full_tensor().detach() if hasattr(loss, "full_tensor") else loss.detach())

    step(0)
    mode = _comm_mode_with_bytes()(world)
    with mode, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # the mode's module tracker warns about backward hooks
        step(1)
    counts = {str(k).split(".")[-1]: v for k, v in mode.get_comm_counts().items()}
    t, losses = timed_steps(step, a.steps, a.warmup, _sync)
    return {"time_s": t, "losses": losses, "bytes": sum(mode.bytes.values()), "wire": mode.wire,
            "calls": sum(counts.values()), "by_op": dict(mode.bytes), "counts": counts}


# ---------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt-tiny", help=f"one of {', '.join(NAMED_SIZES)}")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--heads", type=int, default=8, help="attention heads (DTensor TP needs heads %% ranks == 0)")
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    ap.add_argument("--steps", type=int, default=6, help="timed steps of each side")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick-steps", type=int, default=2, help="timed steps per grid in the quick sweep")
    ap.add_argument("--grid", default=None, help="axgrid grid (default: the best of a quick measured sweep)")
    ap.add_argument("--machine", default=None, help="perf-model machine: sweep only its --top-k grids")
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (default: on GPU only)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", default=None, help="also write the results as JSON (rank 0)")
    a = ap.parse_args(argv)
    a.bf16 = a.bf16 or torch.cuda.is_available()
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    over = {k: getattr(a, k) for k in ("layers", "hidden", "heads", "seq") if getattr(a, k) is not None}
    cfg = GPTConfig.named(a.model, seed=a.seed, **over)
    launch = detect_launch()
    world = launch.world_size
    if cfg.heads % world or cfg.ffn % world or cfg.vocab % world or cfg.hidden % world:
        raise SystemExit(f"DTensor tensor parallelism over {world} ranks needs heads ({cfg.heads}), hidden "
                         f"({cfg.hidden}), ffn ({cfg.ffn}) and vocab ({cfg.vocab}) divisible by {world}; "
                         f"e.g. --heads {world}")
    backend = init_distributed(launch, None, a.timeout)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    rank0 = dist.get_rank() == 0
    try:
        if rank0:
            print(f"bench: {cfg.name} (layers {cfg.layers}, hidden {cfg.hidden}, heads {cfg.heads}, seq {cfg.seq}, "
                  f"vocab {cfg.vocab}, {cfg.parameters():,} parameters), batch {a.batch}, {world} ranks, "
                  f"{backend}, {'bf16' if a.bf16 else 'fp32'}", flush=True)
        sweep: list[tuple[str, float]] = []
        if a.grid:
            best = str(GridShape.parse(a.grid, world))
        else:
            for g in candidate_grids(cfg, world, a):
                r = run_axgrid(cfg, g, a, a.quick_steps, 1)
                sweep.append((g, r["time_s"]))
            best = min(sweep, key=lambda gt: gt[1])[0]
            if rank0:
                print("bench: quick axgrid sweep (s/step): " + ", ".join(f"{g} {t:.3f}" for g, t in
                                                                      sorted(sweep, key=lambda gt: gt[1])),
                      flush=True)
        ax = run_axgrid(cfg, best, a, a.steps, a.warmup)
        # also the best grid without data parallelism (Gd = 1), the like-for-like peer of 1-D tensor parallelism
        tp_only = [gt for gt in sweep if GridShape.parse(gt[0]).gd == 1]
        best_tp = min(tp_only, key=lambda gt: gt[1])[0] if tp_only else None
        ax_tp = run_axgrid(cfg, best_tp, a, a.steps, a.warmup) if best_tp and best_tp != best else None
        dt = run_dtensor(cfg, a, device)
        if rank0:
            ratio = dt["time_s"] / ax["time_s"]
            cols = [("DTensor 1D TP", dt), ("axgrid " + best, ax)] + ([("axgrid " + best_tp, ax_tp)] if ax_tp else [])

            def line(label: str, fmt: Callable[[dict[str, Any]], str]) -> None:
                print(f"{label:<28}" + "".join(f"{fmt(r):>20}" for _, r in cols))

            print("\n" + " " * 28 + "".join(f"{n:>20}" for n, _ in cols))
            line("time per step (s)", lambda r: f"{r['time_s']:.4f}")
            line("bytes per step (rank 0)", lambda r: f"{r['bytes']:,}")
            line("ring wire bytes per rank", lambda r: f"{int(r['wire']):,}")
            line("collectives per step", lambda r: f"{r['calls']}")
            line("first loss", lambda r: f"{r['losses'][0]:.5f}")
            line("last loss", lambda r: f"{r['losses'][-1]:.5f}")
            if ax_tp:
                print(f"\nDTensor / axgrid {best_tp} (no data parallelism) time per step: "
                      f"{dt['time_s'] / ax_tp['time_s']:.2f}x; bytes {dt['bytes'] / max(1, ax_tp['bytes']):.2f}x")
            print(f"\nDTensor / axgrid time per step: {ratio:.2f}x ({'axgrid' if ratio > 1 else 'DTensor'} faster); "
                  f"bytes per step DTensor / axgrid: {dt['bytes'] / max(1, ax['bytes']):.2f}x")
            print(f"DTensor collectives (CommDebugMode counts): {dt['counts']}; bytes by op: {dt['by_op']}")
            print(f"axgrid ledger bytes by grid dimension: {ax['by_dim']}")
            if a.json:
                with open(a.json, "w") as f:
                    json.dump({"world": world, "model": cfg.name, "config": {"layers": cfg.layers,
                               "hidden": cfg.hidden, "heads": cfg.heads, "seq": cfg.seq, "vocab": cfg.vocab},
                               "batch": a.batch, "steps": a.steps, "axgrid_best_grid": best,
                               "quick_sweep": sweep, "axgrid": ax, "axgrid_best_gd1": ax_tp, "dtensor": dt,
                               "ratio": ratio}, f, indent=1)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
