"""Memory and time of every path into and out of a parallel model that no single rank could hold.

    python experiments/bench/bench_load.py                                   # 160m and 1b, on 4 and 8 ranks
    python experiments/bench/bench_load.py --sizes 160m --ranks 4            # one case
    python experiments/bench/bench_load.py --sizes 1024:8:16:8:2816:32000   # hidden:layers:heads:kv_heads:ffn:vocab

The driver makes each LLaMA checkpoint once (random weights, ``LlamaForCausalLM.save_pretrained`` with
``--shard`` as ``max_shard_size``; under ``--dir``), then for each rank count launches two jobs with
``axgrid launch -n N`` (each process builds one grid: ``--grids`` names the first and the other one). Each rank:

job A, on the first grid, in this order:

1. **baseline**: RSS after importing torch, transformers' llama module and axgrid (with the modules the phases
   import on first use: ``torch._dynamo``, which AdamW's first step loads, the checkpoint and export modules),
   and ``axgrid.init``;
2. **disk**: rank 0 reads the checkpoint's files once (the disk limit) while the others wait;
3. **load**: ``axgrid.from_pretrained(checkpoint, grid)``: time and peak RSS; the rank's own parameter bytes;
4. **step**: ``--steps`` AdamW steps (``axgrid.train_step``) under bf16 autocast on ``[batch, seq]`` tokens;
5. **save**: ``axgrid.checkpoint.save_checkpoint`` of model and optimizer;
6. **export**: ``axgrid.export_pretrained`` (streamed; the optimizer is dropped first);
7. **today**: transformers' ``from_pretrained`` + ``axgrid.parallelize`` (time, peak RSS), the model freed
   first -- skipped with a note when every rank's dense copy together would not fit in the available memory;

job B, on the other grid: its own baseline, then

8. **reload**: the model built there by ``axgrid.from_pretrained`` (not measured), then ``load_checkpoint`` of
   job A's checkpoint, model and optimizer (its peak): its logits against job A's after the steps (another
   grid: equal up to the summation order, which shows in bf16);
9. ``axgrid.from_pretrained`` of job A's export: its logits against the reloaded model's on the same grid.

Peak RSS per phase: the kernel's own high-water mark, reset at the start of each phase by writing ``5`` to
``/proc/self/clear_refs`` and read from ``VmHWM`` in ``/proc/self/status`` at its end: exact (no sampling
thread that could miss a short spike), Linux only. Before the reset, what earlier phases freed is handed back to
the OS (``gc.collect()`` and glibc's ``malloc_trim(0)``): glibc keeps freed blocks below its mmap threshold
(up to 32 MiB, i.e. most parameter parts) in the heap, which would otherwise count as the next phase's memory.
The baseline and the available memory come from psutil.

Page cache: before each timed read of the checkpoint (disk, load, today) rank 0 evicts the checkpoint's files
from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)`` per file; the files were fsynced when made, so their
pages are clean and really dropped), so all three read from the disk, i.e. all are cold.

Goal: peak RSS of each phase <= baseline + 1.5 x the rank's own bytes + the largest single slice.
Own bytes: its parameters (load, reload, export); parameters, gradients, AdamW's two moments and the step's
activations and gathered-weight buffers as perfmodel's memory model counts them (``memory_per_gpu``'s
``activations + buffers`` for a GPT of the same hidden size, layers, heads, vocab, sequence; fp32) in the step;
parameters and AdamW's moments in the save. Largest single slice: the largest of the rank's own tensors (a part,
or a tensor replicated whole), and on the writing rank of the export the largest dense tensor (what the goal
allows it: one tensor; it assembles 16 MiB slabs of rows, so its rise is printed beside). Printed per rank
with PASS/FAIL; the load time beside the disk read and today's path, as ratios.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import math
import os
import re
import subprocess
import sys
import time

SIZES = {   # hidden, layers, heads, kv_heads, ffn, vocab
    "tiny": (64, 2, 4, 2, 128, 256),
    "160m": (1024, 8, 16, 8, 2816, 32000),
    "1b": (2048, 20, 32, 8, 5632, 32000),
}
#: first grid, reload grid; 8 ranks start on 8x1x1x1: the embedding [V, h/Gx] is replicated over y and z, so all
#: of x holds the least per rank (the 1B model's AdamW step needs ~20 GB on 8 ranks even so)
DEFAULT_GRIDS = {4: ("2x2x1x1", "1x2x2x1"), 8: ("8x1x1x1", "2x2x2x1")}
PHASES = ("load", "step", "save", "reload", "export")
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))


def parse_size(text: str) -> tuple[int, ...]:
    if text in SIZES:
        return SIZES[text]
    parts = text.split(":")
    if len(parts) != 6 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--sizes: {text!r} is neither one of {sorted(SIZES)} nor hidden:layers:heads:kv:ffn:vocab")
    return tuple(int(p) for p in parts)


def llama_config(size: tuple[int, ...], seq: int):
    from transformers import LlamaConfig
    h, layers, heads, kv, ffn, vocab = size
    return LlamaConfig(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                       intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=max(seq, 128),
                       tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def make_checkpoint(where: str, size: tuple[int, ...], shard: str, seq: int) -> None:
    """A random-weight LLaMA written by save_pretrained (sharded), its files fsynced (clean pages: evictable)."""
    if os.path.exists(os.path.join(where, "config.json")):
        return
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = LlamaForCausalLM(llama_config(size, seq))
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(where + ".tmp", max_shard_size=shard)
    del model
    for f in os.listdir(where + ".tmp"):
        with open(os.path.join(where + ".tmp", f), "rb+") as fh:
            os.fsync(fh.fileno())
    os.replace(where + ".tmp", where)
    print(f"made {where}: {n / 1e6:.0f}M parameters in {time.perf_counter() - t0:.0f} s", flush=True)


# -- the worker: one rank ------------------------------------------------------------------------------------------

def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024


def weight_files(path: str) -> list[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))


def evict(path: str) -> None:
    for f in weight_files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_once(path: str) -> float:
    buf = bytearray(64 * 2**20)
    t0 = time.perf_counter()
    for f in weight_files(path):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - t0


def tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


class Rank:
    """One rank of a launched job: its grid, its record and the phase timer."""

    def __init__(self, args: argparse.Namespace, spec: str) -> None:
        import psutil
        import torch
        import transformers.models.llama.modeling_llama  # noqa: F401  (the model class's module: in the baseline)
        import torch._dynamo  # noqa: F401  (loaded by the optimizer's first step: part of the baseline)
        import axgrid
        import axgrid.checkpoint  # noqa: F401
        import axgrid.io.export  # noqa: F401
        from transformers.utils import logging
        logging.set_verbosity_error()
        torch.set_num_threads(1)
        self.grid = axgrid.init(spec, timeout_s=args.collective_timeout)
        self.proc = psutil.Process()
        self.rec: dict = {"rank": self.grid.rank, "baseline": self.proc.memory_info().rss}
        self.ids = torch.randint(0, parse_size(args.size)[5], (args.batch, args.seq),
                                 generator=torch.Generator().manual_seed(1))

    def phase(self, name: str, fn):
        """Run ``fn`` between two barriers; record its wall time and the peak RSS during it."""
        from axgrid.io import agree
        agree(self.grid, [0])
        gc.collect()
        _LIBC.malloc_trim(0)
        self.rec[f"{name}_start"] = self.proc.memory_info().rss
        reset_peak()
        t0 = time.perf_counter()
        out = fn()
        agree(self.grid, [0])
        self.rec[f"{name}_s"] = time.perf_counter() - t0
        self.rec[f"{name}_peak"] = peak_rss()
        print(f"{name}: {self.rec[f'{name}_s']:.1f} s, peak RSS {self.rec[f'{name}_peak'] / 2**20:.0f} MiB", flush=True)
        return out

    def logits(self, model):
        import torch
        from axgrid.plans import gather_logits
        with torch.no_grad():
            return gather_logits(model(input_ids=self.ids).logits, self.grid).float()


def own_sizes(model) -> dict[str, int]:
    """This rank's parameter bytes, its largest own tensor, and the largest dense tensor."""
    sd = model.state_dict(keep_vars=True)
    return {"own": tensor_bytes(list(model.parameters())),
            "slice": max(t.numel() * t.element_size() for t in sd.values()),
            "dense_max": max(math.prod(t.axgrid_tile.dense_shape) * t.element_size()
                             if getattr(t, "axgrid_tile", None) is not None else t.numel() * t.element_size()
                             for t in sd.values())}


def optim_bytes(opt) -> int:
    import torch
    return tensor_bytes([v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim()])


def job_a(args: argparse.Namespace) -> None:
    """On the first grid: disk, load, step, save, export, today's path."""
    import psutil
    import torch
    import axgrid
    from axgrid.checkpoint import save_checkpoint
    from axgrid.io import agree
    from axgrid.perfmodel.memory import memory_per_gpu
    from axgrid.perfmodel.problem import Options
    from axgrid.spec import TransformerShape
    me = Rank(args, args.grid)
    grid, rec, ckpt = me.grid, me.rec, args.ckpt
    if grid.rank == 0:
        evict(ckpt)
    me.phase("disk", lambda: read_once(ckpt) if grid.rank == 0 else None)
    if grid.rank == 0:
        evict(ckpt)
    dtype = getattr(torch, args.dtype)
    model = me.phase("load", lambda: axgrid.from_pretrained(ckpt, grid, torch_dtype=dtype))
    rec.update(own_sizes(model))
    rec["read"] = model.axgrid_load_report.bytes_read
    h, layers, heads, _, _, vocab = parse_size(args.size)
    gx, gy, gz, gd = (grid.size(c) for c in "xyzd")
    mem = memory_per_gpu(TransformerShape("llama", layers, h, heads, args.seq, vocab, bias=False), gx, gy, gz, gd,
                         args.batch * args.seq / gz, 4, True, Options())
    rec["act"] = float(mem.activations + mem.buffers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def steps() -> list[float]:
        def loss_of(_):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(input_ids=me.ids, labels=me.ids).loss
        losses = [float(axgrid.train_step(model, opt, loss_of, grid).loss) for _ in range(args.steps)]
        opt.zero_grad(set_to_none=True)
        return losses

    rec["losses"] = me.phase("step", steps)
    rec["optim"] = optim_bytes(opt)
    ref = me.logits(model)
    me.phase("save", lambda: save_checkpoint(os.path.join(args.work, "ckpt"), model, opt, grid, step=args.steps,
                                             keep=1))
    del opt
    me.phase("export", lambda: axgrid.export_pretrained(model, os.path.join(args.work, "export"), grid))
    del model
    if grid.rank == 0:
        torch.save(ref, os.path.join(args.work, "logits.pt"))
    dense_total = sum(os.path.getsize(f) for f in weight_files(ckpt)) * grid.world_size
    (fits,) = agree(grid, [int(dense_total * 2 < psutil.virtual_memory().available)])
    rec["today"] = args.today == "yes" or (args.today == "auto" and fits == grid.world_size)
    rec["today_need"] = dense_total
    if rec["today"]:
        from transformers import LlamaForCausalLM
        if grid.rank == 0:
            evict(ckpt)
        me.phase("today", lambda: axgrid.parallelize(LlamaForCausalLM.from_pretrained(ckpt), grid))
    recs = gather_records(grid, rec)
    if grid.rank == 0:
        with open(os.path.join(args.work, "records-a.json"), "w") as f:
            json.dump(recs, f)
    grid.destroy()


def job_b(args: argparse.Namespace) -> None:
    """On the other grid: the checkpoint of job A loaded (model and optimizer), then from_pretrained of its
    export; both give job A's logits. Prints the table of both jobs."""
    import torch
    import axgrid
    from axgrid.checkpoint import load_checkpoint
    me = Rank(args, args.reshard_grid)
    grid, rec = me.grid, me.rec
    dtype = getattr(torch, args.dtype)
    model = axgrid.from_pretrained(args.ckpt, grid, torch_dtype=dtype)   # the skeleton here (not measured)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec.update({k + "_b": v for k, v in own_sizes(model).items()})
    me.phase("reload", lambda: load_checkpoint(os.path.join(args.work, "ckpt"), model, opt, grid))
    rec["optim_b"] = optim_bytes(opt)
    ref = torch.load(os.path.join(args.work, "logits.pt"))
    mine = me.logits(model)
    rec["reload_diff"] = float((mine - ref).abs().max())
    rec["logit_max"] = float(ref.abs().max())
    del model, opt
    gc.collect()
    back = axgrid.from_pretrained(os.path.join(args.work, "export"), grid, torch_dtype=dtype)
    rec["export_diff"] = float((me.logits(back) - mine).abs().max())
    recs_b = gather_records(grid, rec)
    if grid.rank == 0:
        with open(os.path.join(args.work, "records-a.json")) as f:
            recs_a = json.load(f)
        report([{**a, **{k: v for k, v in b.items() if k not in a or k.endswith("_b")}, "baseline_b": b["baseline"]}
                for a, b in zip(recs_a, recs_b)], args)
    grid.destroy()


def gather_records(grid, rec: dict) -> list[dict]:
    """Every rank's record on every rank, in rank order (JSON bytes all-gathered through the grid's communicator
    over xyz, then d)."""
    import torch
    data = json.dumps(rec).encode()
    big = int(grid.comm.all_gather(torch.tensor([len(data)]), "xyz").max())
    big = int(grid.comm.all_gather(torch.tensor([big]), "d").max())
    buf = torch.zeros(big, dtype=torch.uint8)
    buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    every = grid.comm.all_gather(grid.comm.all_gather(buf, "xyz"), "d").reshape(-1, big)
    return sorted((json.loads(bytes(row.tolist()).rstrip(b"\0")) for row in every), key=lambda r: r["rank"])


def bounds(r: dict, writer: bool) -> dict[str, float]:
    """The goal's bound per phase: baseline + 1.5 x own bytes + the largest single slice."""
    b = r["baseline"]
    return {"load": b + 1.5 * r["own"] + r["slice"],
            "step": b + 1.5 * (2 * r["own"] + r["optim"] + r["act"]) + r["slice"],
            "save": b + 1.5 * (r["own"] + r["optim"]) + r["slice"],
            "reload": r["baseline_b"] + 1.5 * (r["own_b"] + r["optim_b"]) + r["slice_b"],
            "export": b + 1.5 * r["own"] + (r["dense_max"] if writer else r["slice"])}


def report(recs: list[dict], args: argparse.Namespace) -> None:
    """The table: per rank its own bytes, baseline and each phase's peak RSS against the goal's bound."""
    mib = 2**20
    world = len(recs)
    print(f"\n== {args.size} on {world} ranks: grid {args.grid}, reload on {args.reshard_grid}; "
          f"{args.dtype} parameters, steps {args.steps} x [{args.batch}, {args.seq}] bf16 autocast; RSS in MiB ==")
    head = f"{'rank':>4} {'own':>7} {'read':>7} {'base':>6} " + " ".join(f"{p + ' peak/bound':>20}" for p in PHASES)
    print(head)
    verdict = {p: True for p in PHASES}
    for r in recs:
        bd = bounds(r, writer=r["rank"] == 0)
        cells = []
        for p in PHASES:
            ok = r[f"{p}_peak"] <= bd[p]
            verdict[p] &= ok
            cells.append(f"{r[f'{p}_peak'] / mib:7.0f}/{bd[p] / mib:<7.0f}{'PASS' if ok else 'FAIL':>5}")
        print(f"{r['rank']:>4} {r['own'] / mib:7.1f} {r['read'] / mib:7.1f} {r['baseline'] / mib:6.0f} " + " ".join(f"{c:>20}" for c in cells))
    print("peak RSS minus RSS at the phase's start (what the phase itself added), MiB:")
    for r in recs:
        print(f"{r['rank']:>4} " + " ".join(f"{p} {(r[f'{p}_peak'] - r.get(f'{p}_start', r[f'{p}_peak'])) / mib:6.0f}"
                                        for p in PHASES))
    r0 = recs[0]
    load = max(r["load_s"] for r in recs)
    print(f"load {load:.2f} s | disk read once {r0['disk_s']:.2f} s | load/disk {load / r0['disk_s']:.2f} "
          f"({'PASS' if load <= 1.5 * r0['disk_s'] else 'FAIL'} <= 1.5)")
    if r0["today"]:
        today = max(r["today_s"] for r in recs)
        peak = max(r["today_peak"] for r in recs)
        print(f"today's path (HF from_pretrained + parallelize): {today:.2f} s, load/today {load / today:.2f} "
              f"({'PASS' if load < today else 'FAIL'} < 1); its peak RSS max {peak / mib:.0f} MiB = baseline + "
              f"{(peak - r0['baseline']) / r0['own']:.1f} x own parameters")
    else:
        print(f"today's path not run: {world} dense copies need {r0['today_need'] / 2**30:.1f} GiB")
    export_bytes = sum(os.path.getsize(os.path.join(args.work, "export", f))
                       for f in os.listdir(os.path.join(args.work, "export")) if f.endswith(".safetensors"))
    export_s = max(r["export_s"] for r in recs)
    print(f"export {export_s:.2f} s for {export_bytes / 2**20:.0f} MiB of safetensors "
          f"({export_bytes / 2**20 / export_s:.0f} MiB/s); the writing rank's rise {(r0['export_peak'] - r0['export_start']) / mib:.0f} MiB against its "
          f"largest dense tensor {r0['dense_max'] / mib:.0f} MiB (it assembles slabs of 16 MiB of rows)")
    print(f"step losses {', '.join(f'{x:.4f}' for x in r0['losses'])} | reloaded on {args.reshard_grid} vs "
          f"before the save on {args.grid}: logits max diff {max(r['reload_diff'] for r in recs):.2e} (max |logit| "
          f"{r0['logit_max']:.1f}) | from_pretrained(export) vs the reloaded model, same grid: "
          f"{max(r['export_diff'] for r in recs):.2e}")
    print("phases:", " ".join(f"{p} {'PASS' if verdict[p] else 'FAIL'}" for p in PHASES), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"size": args.size, "ranks": world, "grid": args.grid,
                                "reshard_grid": args.reshard_grid, "records": recs}) + "\n")


# -- the driver ----------------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="160m,1b", help=f"comma list of {sorted(SIZES)} or h:L:heads:kv:ffn:vocab")
    ap.add_argument("--ranks", default="4,8", help="comma list of rank counts")
    ap.add_argument("--grids", default="", help="e.g. 4=2x2x1x1:1x2x2x1,8=2x2x2x1:4x2x1x1 (first grid, reload grid)")
    ap.add_argument("--dir", default="/tmp/axgrid-bench-load", help="checkpoints and outputs go here")
    ap.add_argument("--shard", default="500MB", help="max_shard_size of the made checkpoint")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--today", choices=("auto", "yes", "no"), default="auto")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="parameter dtype")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for each launched job")
    ap.add_argument("--collective-timeout", type=float, default=900.0)
    ap.add_argument("--json", default="", help="append every rank's figures to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job", choices=("a", "b"), default="a", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default="", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    ap.add_argument("--grid", default="", help=argparse.SUPPRESS)
    ap.add_argument("--reshard-grid", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return job_a(args) if args.job == "a" else job_b(args)
    grids = dict(DEFAULT_GRIDS)
    for item in filter(None, args.grids.split(",")):
        n, pair = item.split("=")
        grids[int(n)] = tuple(pair.split(":"))
    for name in args.sizes.split(","):
        size = parse_size(name)
        ckpt = os.path.join(args.dir, "ckpt-" + name.replace(":", "-"))
        os.makedirs(args.dir, exist_ok=True)
        make_checkpoint(ckpt, size, args.shard, args.seq)
        for n in (int(x) for x in args.ranks.split(",")):
            if n not in grids:
                raise SystemExit(f"--ranks {n}: no grid for {n} ranks; give one with --grids {n}=AxBxCxD:ExFxGxH")
            work = os.path.join(args.dir, f"work-{name.replace(':', '-')}-{n}")
            os.makedirs(work, exist_ok=True)
            for job in ("a", "b"):        # two jobs: a process builds one grid (no second init in a process)
                cmd = [sys.executable, "-m", "axgrid.cli", "launch", "-n", str(n), "--timeout", str(args.timeout),
                       "--", sys.executable, os.path.abspath(__file__), "--worker", "--job", job, "--size", name,
                       "--ckpt", ckpt, "--work", work, "--grid", grids[n][0], "--reshard-grid", grids[n][1],
                       "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq), "--today",
                       args.today, "--dtype", args.dtype, "--collective-timeout", str(args.collective_timeout)] + \
                    (["--json", args.json] if args.json else [])
                subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_load")     # errors said once, as one line (axgrid.launch.errors)
