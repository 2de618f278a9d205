"""sbatch scripts for the top-k configurations (the original launched its top 20 as short jobs).

For a machine profile of CPU ranks (``perfmodel calibrate`` writes ``gpu = "cpu rank"``: gloo on this host) the
script asks for tasks, not GPUs, so it runs as written on a Slurm without GPUs (tests/test_slurm.py submits one).
"""
from __future__ import annotations

from pathlib import Path

from .machines import CPU_RANK
from .rank import Ranking, Row


def sbatch_script(rk: Ranking, row: Row, steps: int = 20, minutes: int = 30) -> str:
    """One sbatch script running ``experiments/train/train_gpt.py`` with this row's grid under srun."""
    p, m = rk.problem, rk.machine
    nodes = -(-p.gpus // m.gpus_per_node)
    per_node = min(p.gpus, m.gpus_per_node)
    name = f"axgrid-{p.model.name}-{row.grid_str}"
    gpus = "" if m.gpu == CPU_RANK else f"#SBATCH --gpus-per-node={per_node}\n"
    model_args = (f"--model {p.model.name}" if p.model.name else
                  f"--layers {p.model.layers} --hidden {p.model.hidden} --heads {p.model.heads}")
    return f"""#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={per_node}
{gpus}#SBATCH --time=00:{minutes:02d}:00
#SBATCH --output={name}-%j.out
# perfmodel rank {row.rank}: predicted {row.time_s:.3f} s/batch, {row.tflops_per_gpu:.1f} TFLOP/s/GPU \
({row.pct_peak:.1f}% of peak), {row.memory_bytes / 2**30:.1f} GiB/GPU on {m.name}
set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
srun --kill-on-bad-exit=1 --cpu-bind=none python experiments/train/train_gpt.py {model_args} --seq {p.model.seq} --vocab {p.model.vocab} \\
    --grid {row.grid_str} --batch {p.batch} --microbatches {row.microbatches} --dtype {p.dtype} \\
    --overlap {p.options.overlap_spec()} {'--recompute ' if p.options.recompute else ''}--zero {row.zero} \
    --steps {steps}
"""


def emit_slurm(rk: Ranking, outdir: str | Path, top: int) -> list[Path]:
    """Write ``rankNN_GRID.sbatch`` for the ``top`` best feasible rows; returns the paths."""
    d = Path(outdir)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for row in rk.top(top):
        f = d / f"rank{row.rank:02d}_{row.grid_str}.sbatch"
        f.write_text(sbatch_script(rk, row))
        out.append(f)
    return out
