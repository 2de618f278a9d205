"""axgrid's best grid beside PyTorch's own tensor parallelism, at full scale, in one process (the dry run).

The same GPT step (axgrid.models.gpt.GPT's modules, bf16 autocast, activation recompute, AdamW, batch ``--batch``
sequences) under torch's fake process group and fake tensors, as rank 0 of ``--gpus`` GPUs:

- PyTorch: DTensor 1-D tensor parallelism inside a node (Megatron's plan: QKV and MLP-up ``ColwiseParallel``,
  attention-out and MLP-down ``RowwiseParallel``, the LM head column-parallel into ``loss_parallel``) with sequence
  parallelism (the layer norms and the residual stream split over the sequence, ``SequenceParallel``), and FSDP2
  (``fully_shard`` per block and at the root, bf16 weights gathered and fp32 gradients reduced) across the nodes;
- axgrid: perfmodel's best 4D grid for the same model, GPUs, machine and batch (``axgrid.dryrun``).

Per rank per step: bytes inside a node and across nodes, and the peak of live tensor bytes. PyTorch's bytes are
counted in axgrid's ledger convention (the all-reduced tensor, the all-gather's output, the reduce-scatter's input):
the tensor-parallel collectives (DTensor's functional collectives) are inside a node, FSDP2's across nodes.
axgrid's per grid dimension, inside a node when the dimension's groups are (``perfmodel.comm.dim_strides``). The
time column is what perfmodel's machine puts on those bytes at its bandwidths (intra: one GPU's ring bandwidth;
inter: the node's NICs shared by its GPUs), without latency or overlap: a lower bound for comparison, not a step
time.

    python experiments/bench/bench_peers_scale.py --model gpt-20b --gpus 512 --machine frontier --batch 512
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from axgrid.launch.errors import run
from peers.comm_bytes import collective_bytes   # experiments/bench/peers/


class CommBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Bytes of the collectives dispatched: DTensor's functional collectives (``_c10d_functional``: the
    tensor-parallel group, inside a node here) and c10d's (FSDP2's, across the nodes)."""

    def __init__(self) -> None:
        super().__init__()
        self.intra = self.inter = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ns = func.namespace
        if ns == "_c10d_functional" and "wait" not in func.__name__:
            self.intra += collective_bytes(func._overloadpacket.__name__, args)
        elif ns == "c10d" and any(k in func.__name__ for k in ("gather", "scatter", "allreduce", "broadcast")):
            self.inter += collective_bytes(func._overloadpacket.__name__, args)
        return out


def pytorch_tp_fsdp(model_name: str, gpus: int, tp: int, batch: int) -> dict:
    """One step of DTensor TP+SP (``tp`` ranks, a node) and FSDP2 over the ``gpus/tp`` nodes, rank 0: bytes inside
    and across nodes, peak live bytes, seconds."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel, loss_parallel,
                                                   parallelize_module)
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils.checkpoint import checkpoint

    from axgrid.dryrun.step import PeakWatch
    from axgrid.metrics import memtrack as mt
    from axgrid.models.gpt import GPT, GPTConfig

    start = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=gpus)
    try:
        cfg = GPTConfig.named(model_name, recompute=True)
        dp = gpus // tp
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        with torch.device("meta"):
            model = GPT(cfg, init=False)
        seq = {"input_layouts": Shard(0)}
        plan = {"head": ColwiseParallel(input_layouts=Shard(0), output_layouts=Shard(-1), use_local_output=False),
                "ln_f": SequenceParallel(sequence_dim=0)}
        for i in range(cfg.shape.layers):
            plan.update({f"blocks.{i}.ln1": SequenceParallel(sequence_dim=0),
                         f"blocks.{i}.ln2": SequenceParallel(sequence_dim=0),
                         f"blocks.{i}.qkv": ColwiseParallel(**seq), f"blocks.{i}.up": ColwiseParallel(**seq),
                         f"blocks.{i}.proj": RowwiseParallel(output_layouts=Shard(0), use_local_output=False),
                         f"blocks.{i}.down": RowwiseParallel(output_layouts=Shard(0), use_local_output=False)})
        parallelize_module(model, mesh["tp"], plan)
        # bf16 weights gathered, gradients reduced in fp32: what axgrid does under autocast (torchtitan's default)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model.blocks:
            blk.heads_local = cfg.shape.heads // tp
            fully_shard(blk, mesh=mesh["dp"], mp_policy=mp)
        tp_mesh = mesh["tp"]

        class Step(torch.nn.Module):
            def __init__(self, m: GPT) -> None:
                super().__init__()
                self.m = m

            def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                m = self.m
                b, s = tokens.shape
                pos = torch.arange(s, device=tokens.device).repeat(b)
                x = m.wte(tokens.reshape(-1)) + m.wpe(pos)                # [b·S, h], the same on the node's ranks
                x = DTensor.from_local(x, tp_mesh, [Replicate()]).redistribute(tp_mesh, [Shard(0)])   # SP
                for blk in m.blocks:
                    x = checkpoint(blk, x, b, s, use_reentrant=False)
                logits = m.head(m.ln_f(x))
                with loss_parallel():
                    return F.cross_entropy(logits.float(), targets.reshape(-1))

        net = Step(model)
        fully_shard(net, mesh=mesh["dp"], mp_policy=mp)
        with FakeTensorMode(allow_non_fake_inputs=True):
            net.to_empty(device="cpu")
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=False, fused=True)
            ids = torch.zeros((batch // dp, cfg.shape.seq + 1), dtype=torch.long)

            def one_step(live=None) -> None:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = net(ids[:, :-1], ids[:, 1:])
                if live is not None:
                    live.phase = "backward"
                with loss_parallel():
                    loss.backward()
                if live is not None:
                    live.phase = "clipping and AdamW"
                clip(list(net.parameters()), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)

            def clip(ps: list, max_norm: float) -> None:
                """torch's clipping per device mesh (its ``clip_grad_norm_`` cannot stack norms of two meshes, the
                FSDP-only and the FSDP×TP parameters), the meshes' norms combined as torchtitan does."""
                by_mesh: dict = {}
                for p in ps:
                    if p.grad is not None:
                        by_mesh.setdefault(id(p.grad.device_mesh), []).append(p)
                norms = [torch.nn.utils.get_total_norm([p.grad for p in group], foreach=True).full_tensor()
                         for group in by_mesh.values()]
                total = torch.linalg.vector_norm(torch.stack(norms))
                for group in by_mesh.values():
                    torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)

            one_step()                                 # AdamW's state exists from here on
            params = list(net.parameters())
            local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
            state = [v.to_local() if isinstance(v, DTensor) else v for v in mt.optimizer_tensors(opt)]
            live = PeakWatch(itertools.chain(local, state))
            comm = CommBytes()
            live.phase = "forward"
            with live, comm, live.modules(net):
                one_step(live)
        return {"who": f"DTensor TP{tp}+SP, FSDP2 over {dp}", "intra": comm.intra, "inter": comm.inter,
                "peak": live.peak, "moment": live.moment, "seconds": time.perf_counter() - start}
    finally:
        dist.destroy_process_group()


def axgrid_best(model_name: str, gpus: int, machine: str, batch: int, grid: str | None = None) -> dict:
    """axgrid's best grid for the problem (or ``grid``), dry-run as rank 0 (bytes split by where each dimension's
    groups lie)."""
    from axgrid import perfmodel as pm
    from axgrid.dryrun import resolve
    from axgrid.dryrun.config import bytes_by_dim
    from axgrid.dryrun.step import measure_rank
    from axgrid.perfmodel.comm import dim_strides
    cfg = resolve(model_name, gpus, batch, machine=machine, grid=grid)
    m = measure_rank(cfg, 0)
    per_node = pm.load_machine(machine).gpus_per_node
    gx, gy, gz, gd = cfg.shape
    strides = {k: (int(s), int(n)) for k, (n, s) in dim_strides(gx, gy, gz, gd).items()}
    intra = inter = 0
    for dim, nbytes in bytes_by_dim(m.comm).items():
        if dim in strides:
            stride, size = strides[dim]
            inside = stride * size <= per_node
        else:                                    # "xyz": the clipping's 8 bytes
            inside = gx * gy * gz <= per_node
        intra, inter = (intra + nbytes, inter) if inside else (intra, inter + nbytes)
    zero = f" zero {cfg.zero}" if cfg.zero else ""
    return {"who": f"axgrid {cfg.grid}{zero}" + ("" if grid else " (perfmodel's best)"), "intra": intra,
            "inter": inter, "peak": m.peak, "seconds": m.seconds}


def seconds_on(machine: str, intra: int, inter: int) -> float:
    """Bytes at perfmodel's machine bandwidths (see the module docstring)."""
    from axgrid import perfmodel as pm
    mach = pm.load_machine(machine)
    nic = mach.inter_node_bandwidth_per_nic * mach.nics_per_node / mach.gpus_per_node
    return intra / mach.intra_node_bandwidth + inter / nic


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--machine", default="frontier")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--tp", type=int, help="tensor-parallel ranks (default: the machine's GPUs per node)")
    ap.add_argument("--grid", action="append", default=[], help="also dry-run this axgrid grid (repeatable)")
    ap.add_argument("--only", choices=("pytorch", "axgrid"), help="run one side only (each in its own process: the "
                    "dry run's device cannot be registered twice)")
    ap.add_argument("--json", help="append the rows to this JSON-lines file")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    from axgrid import perfmodel as pm
    tp = a.tp or pm.load_machine(a.machine).gpus_per_node
    rows = []
    if a.only != "axgrid":
        rows.append(pytorch_tp_fsdp(a.model, a.gpus, tp, a.batch))
    if a.only != "pytorch":
        rows.append(axgrid_best(a.model, a.gpus, a.machine, a.batch))
        rows += [axgrid_best(a.model, a.gpus, a.machine, a.batch, g) for g in a.grid]
    for r in rows:
        r.update(model=a.model, gpus=a.gpus, machine=a.machine, batch=a.batch,
                 comm_seconds=seconds_on(a.machine, r["intra"], r["inter"]))
        print(f"{a.model} on {a.gpus} GPUs of {a.machine}, batch {a.batch}: {r['who']}: inside a node "
              f"{r['intra'] / 2**30:.2f} GiB, across nodes {r['inter'] / 2**30:.2f} GiB per rank per step, peak "
              f"{r['peak'] / 2**30:.2f} GiB, {r['comm_seconds']:.2f} s at the machine's bandwidths "
              f"(dry run {r['seconds']:.0f} s)", flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    run(main, "bench_peers_scale")
