"""Command line: ``python -m axgrid.kernels {tune,show,export-efficiency}``.

    python -m axgrid.kernels tune --model gpt-20b --grid 2x2x2x1 --dtype bf16 --tokens 4096
    python -m axgrid.kernels show
    python -m axgrid.kernels export-efficiency efficiency.json
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import torch

from axgrid.device import cuda as gpu
from axgrid.spec import NAMED_SIZES, GridShape

from .cache import GemmCache
from .candidates import DEFAULT
from .shapes import layer_gemm_shapes
from .signature import parse_dtype
from .tuner import GemmTuner
from .validators import current_validators


def entry_times(entry: dict) -> dict[str, float]:
    """Median seconds per candidate: the confirmation run's when there was one (unbiased), else the tuning run's."""
    return entry.get("confirm_s") or entry.get("times_s", {})


def _sizes(e: dict) -> tuple[int, int, int] | None:
    """(m, n, k) of an entry, None when any is missing (entries written by hand or by older versions)."""
    mnk = tuple(e.get(f) for f in ("m", "n", "k"))
    return mnk if all(isinstance(v, int) for v in mnk) else None  # type: ignore[return-value]


def efficiency_records(entries: dict[str, dict]) -> list[dict]:
    """[{m, n, k, dtype, role, device, device_name, flops_per_s}] for the winner of every complete cache entry."""
    out = []
    for e in entries.values():
        t = entry_times(e).get(e["winner"])
        mnk = _sizes(e)
        if not t or mnk is None or not all(isinstance(e.get(f), str) for f in ("dtype", "role", "device")):
            continue
        m, n, k = mnk
        out.append({"m": m, "n": n, "k": k, "dtype": e["dtype"], "role": e["role"],
                    "device": e["device"], "device_name": (e.get("validators") or {}).get("device_name"),
                    "flops_per_s": 2.0 * m * n * k / t})
    return out


def _cmd_tune(args: argparse.Namespace) -> int:
    from tqdm import tqdm  # noqa: PLC0415

    device = _tune_device(args.device)
    parse_dtype(args.dtype)
    shapes: dict[tuple[int, int, int, str], None] = {}
    for grid in args.grid:
        for s in layer_gemm_shapes(args.model, GridShape.parse(grid), args.tokens):
            shapes.setdefault(s, None)
    tuner = GemmTuner("on-first-use", cache_path=args.cache, margin=args.margin,
                      max_tune_seconds=args.max_tune_seconds, warmup=args.warmup, repeats=args.repeats)
    changed = capped = 0
    bar = tqdm(list(shapes), desc=f"tuning {args.model} {'/'.join(args.grid)}", unit="gemm")
    for m, n, k, role in bar:
        bar.set_postfix_str(f"{role} {m}x{n}x{k}")
        entry = tuner.tune(m, n, k, args.dtype, device, role, force=args.force)
        changed += entry["winner"] != DEFAULT
        capped += bool(entry.get("untimed"))
    print(f"{len(shapes)} signatures ({tuner.stats.tuned} timed, {tuner.stats.cache_hits} already cached); "
          f"{changed} use a non-default candidate. Cache: {tuner.cache.path}")
    if capped:
        print(f"{capped} signature(s) reached --max-tune-seconds {args.max_tune_seconds:g} before every candidate was "
              f"timed; they keep what was measured (raise the cap and pass --force to time them fully)")
    return 0


def _tune_device(name: str | None) -> torch.device:
    """The device to tune on: ``cpu`` or an existing CUDA device; a ValueError naming the fix otherwise."""
    if name is None:
        return torch.device("cuda" if gpu.count() > 0 else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {name!r} is not a device name; use cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"--device {name}: the tuner times cpu and cuda devices only; use cpu, cuda or cuda:N")
    if gpu.count() == 0:
        raise ValueError(f"--device {name}: no CUDA GPU is visible here (torch sees none); run "
                         f"on a GPU node, or tune for this machine with --device cpu")
    if device.index is not None and device.index >= gpu.count():
        raise ValueError(f"--device {name}: only {gpu.count()} CUDA device(s) are visible "
                         f"(cuda:0..cuda:{gpu.count() - 1})")
    return device


def _cmd_show(args: argparse.Namespace) -> int:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    cache = GemmCache(args.cache)
    entries = cache.load()
    table = Table(title=f"GEMM decisions in {cache.path} ({len(entries)} entries)")
    for col in ("device", "dtype", "role", "m", "n", "k", "winner", "default ms", "winner ms", "speedup",
                "GFLOP/s", "device name", "valid here"):
        table.add_column(col, justify="right" if col in ("m", "n", "k") or col.endswith(("ms", "/s", "up")) else "left")
    current: dict[str, dict | None] = {}

    def text(e: dict, f: str) -> str:
        return "?" if e.get(f) is None else str(e[f])

    for key in sorted(entries, key=lambda k: tuple(text(entries[k], f) for f in ("device", "dtype", "role", "m", "n",
                                                                                   "k"))):
        e = entries[key]
        times = entry_times(e)
        t_def, t_win = times.get(DEFAULT), times.get(e["winner"])
        dev = text(e, "device")
        if dev not in current:
            current[dev] = (current_validators(dev) if dev == "cpu" or (dev == "cuda" and gpu.count() > 0)
                            else None)
        valid = "?" if current[dev] is None else ("yes" if e.get("validators") == current[dev] else "stale")
        mnk = _sizes(e)
        flops = 2.0 * mnk[0] * mnk[1] * mnk[2] if mnk else None
        table.add_row(dev, text(e, "dtype"), text(e, "role"), text(e, "m"), text(e, "n"), text(e, "k"), e["winner"],
                      f"{t_def * 1e3:.3f}" if t_def else "-", f"{t_win * 1e3:.3f}" if t_win else "-",
                      f"{t_def / t_win:.2f}x" if t_def and t_win else "-",
                      f"{flops / t_win / 1e9:.1f}" if t_win and flops else "-",
                      str((e.get("validators") or {}).get("device_name")), valid)
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=240)
    console.print(table)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    records = efficiency_records(GemmCache(args.cache).load())
    try:
        with open(args.file, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)
    except OSError as exc:
        raise ValueError(f"cannot write {args.file!r}: {exc.strerror or exc}; choose a writable path") from None
    print(f"wrote {len(records)} records to {args.file}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m axgrid.kernels", description="axgrid GEMM layout auto-tuner")
    sub = p.add_subparsers(dest="cmd", required=True)
    cache_help = "cache file (default: $AXGRID_GEMM_CACHE or ~/.cache/axgrid/gemm.json)"

    t = sub.add_parser("tune", help="tune the per-rank GEMMs of a model on a grid ahead of time")
    t.add_argument("--model", required=True, help=f"one of {', '.join(NAMED_SIZES)}")
    t.add_argument("--grid", nargs="+", required=True, help="GXxGYxGZxGD, e.g. 2x2x2x1 (several allowed)")
    t.add_argument("--dtype", default="bf16", help="bf16, fp16, fp32 (default bf16)")
    t.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch (batch x sequence)")
    t.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    t.add_argument("--cache", default=None, help=cache_help)
    t.add_argument("--margin", type=float, default=0.03, help="fraction a candidate must beat the default by")
    t.add_argument("--max-tune-seconds", type=float, default=5.0, help="time cap per signature")
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--repeats", type=int, default=20)
    t.add_argument("--force", action="store_true", help="re-time signatures that are already cached")
    t.set_defaults(func=_cmd_tune)

    s = sub.add_parser("show", help="print the cache as a table")
    s.add_argument("--cache", default=None, help=cache_help)
    s.set_defaults(func=_cmd_show)

    e = sub.add_parser("export-efficiency", help="write achieved FLOP/s per shape (JSON) for perfmodel")
    e.add_argument("file")
    e.add_argument("--cache", default=None, help=cache_help)
    e.set_defaults(func=_cmd_export)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
