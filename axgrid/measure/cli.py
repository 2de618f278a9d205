"""Measure this machine on real ranks for the performance model; writes the JSON ``perfmodel`` reads.

    # collectives + GEMMs -> samples that `perfmodel calibrate` fits into a machine file
    axgrid launch -n 4 -- python -m axgrid.measure collectives --out runs/calibration.json
    python -m axgrid.perfmodel calibrate --samples runs/calibration.json --out runs/local.toml

    # seconds per training step of the configurations `perfmodel validate` compares with its predictions
    axgrid launch -n 4 -- python -m axgrid.measure steps --model gpt-tiny --gpus 4 --machine local-4 \\
        --batch 8 --dtype fp32 --top 4 --sample 4 --out runs/steps.json
    python -m axgrid.perfmodel validate --model gpt-tiny --gpus 4 --machine local-4 --batch 8 --dtype fp32 \\
        --measured runs/steps.json

What is measured and the JSON formats: :mod:`axgrid.measure.collectives`, :mod:`axgrid.measure.steps`.

Ranks use gloo on the CPU, one thread each. Rank 0 writes the file. Also callable in-process on every rank of an
already-initialised default group: ``main(argv)`` (tests run it on an ``axgrid.testing.RankPool``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from .. import perfmodel as pm
from ..perfmodel import calibrate as pm_calibrate
from ..perfmodel import cli as pm_cli
from .collectives import DTYPES, OPS, measure_collectives
from .steps import measure_steps


def _ints(text: str) -> list[int]:
    try:
        return [int(float(v)) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m axgrid.measure", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collectives", help="collective and GEMM samples for `perfmodel calibrate --samples`")
    c.add_argument("--sizes", default="1024,8192,65536,524288,4194304",
                   help="collective buffer sizes in bytes, comma-separated")
    c.add_argument("--ops", default=",".join(OPS), help="collectives to time, comma-separated")
    c.add_argument("--gemm-cubes", default="32,64,128,256,512", help="m=n=k of square GEMMs to time")
    c.add_argument("--model", help="also time this named model's GEMM shapes on the grids of this many ranks")
    c.add_argument("--batch", type=int, default=8, help="global batch for --model's GEMM shapes")
    c.add_argument("--gemm-dtype", default="fp32", choices=list(DTYPES))
    c.add_argument("--gemm-min-time", type=float, default=0.05, help="seconds of each GEMM's timing window")
    c.add_argument("--reps", type=int, default=5, help="timed repetitions per collective")
    c.add_argument("--warmup", type=int, default=2, help="untimed repetitions per collective")
    s = sub.add_parser("steps", help="seconds per step for `perfmodel validate --measured`")
    pm_cli.add_problem_args(s)
    s.add_argument("--top", type=int, default=8, help="the ranking's best configurations to time")
    s.add_argument("--sample", type=int, default=8, help="more configurations drawn at random from the rest")
    s.add_argument("--seed", type=int, default=0, help="seed of the random draw")
    s.add_argument("--steps", type=int, default=3, help="timed steps per configuration")
    s.add_argument("--warmup", type=int, default=1, help="untimed steps per configuration")
    s.add_argument("--rounds", type=int, default=2, help="interleaved passes over the configurations; best kept")
    for p in (c, s):
        p.add_argument("--out", required=True, help="JSON file to write (rank 0)")
        p.add_argument("--timeout", type=float, default=120.0, help="seconds before a stuck collective fails")
    return ap


def _check(a: argparse.Namespace) -> None:
    """Refuse bad options (the same on every rank, before any collective); fills a.sizes, a.ops, a.shapes."""
    if not a.timeout > 0:
        raise ValueError(f"--timeout must be > 0, got {a.timeout}")
    if a.cmd == "collectives":
        a.sizes, a.ops = _ints(a.sizes), [o.strip() for o in a.ops.split(",") if o.strip()]
        if not a.sizes or min(a.sizes) < 4:
            raise ValueError(f"--sizes must be integers >= 4 bytes, got {a.sizes}")
        bad = [o for o in a.ops if o not in OPS]
        if bad or not a.ops:
            raise ValueError(f"--ops {bad or a.ops}: choose from {', '.join(OPS)}")
        if a.reps < 1 or a.warmup < 0 or not a.gemm_min_time > 0:
            raise ValueError(f"need --reps >= 1, --warmup >= 0, --gemm-min-time > 0 (got {a.reps}, {a.warmup}, "
                             f"{a.gemm_min_time})")
        shapes = {(v, v, v) for v in _ints(a.gemm_cubes)}
        if a.model:
            shapes |= set(pm_calibrate.model_gemm_shapes(pm.get_model(a.model), a.batch, dist.get_world_size()))
        if any(min(shp) < 1 for shp in shapes):
            raise ValueError(f"--gemm-cubes must be positive, got {a.gemm_cubes!r}")
        a.shapes = sorted(shapes, key=lambda t: (t[0] * t[1] * t[2], t))
    elif a.steps < 1 or a.warmup < 0 or a.rounds < 1 or a.top < 0 or a.sample < 0:
        raise ValueError(f"need --steps >= 1, --warmup >= 0, --rounds >= 1, --top/--sample >= 0 (got {a.steps}, "
                         f"{a.warmup}, {a.rounds}, {a.top}, {a.sample})")


def _init_world(timeout_s: float) -> bool:
    """Join the job's default gloo group unless one exists (in-process callers); True when this call made it."""
    if dist.is_initialized():
        return False
    from ..launch.env import detect_launch, init_distributed
    init_distributed(detect_launch(), "gloo", timeout_s)
    return True


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Measure, write ``--out`` on rank 0, return the document (every rank)."""
    a = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    owns = _init_world(a.timeout)
    try:
        try:
            _check(a)
            doc = measure_collectives(a) if a.cmd == "collectives" else measure_steps(a)
        except (ValueError, pm.PerfModelError) as e:
            raise SystemExit(f"axgrid.measure {a.cmd}: {e}") from None
        doc["produced_by"] = "python -m axgrid.measure " + " ".join(argv if argv is not None else sys.argv[1:])
        if dist.get_rank() == 0:
            out = Path(a.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(out.suffix + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, out)
            print(f"wrote {out}", flush=True)
        return doc
    finally:
        if owns:
            dist.destroy_process_group()

