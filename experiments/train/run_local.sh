#!/usr/bin/env bash
# Train a GPT on one node with mpiexec: one rank per GPU (or per CPU slot on a laptop / CPU box).
#
#   experiments/train/run_local.sh                                   # 4 ranks, gpt-tiny on the shipped text
#   NP=8 experiments/train/run_local.sh --model gpt-tiny --grid 2x2x2x1 --steps 50 --data text
#   NP=4 CKPT=runs/local/ckpt experiments/train/run_local.sh ...     # checkpoint every SAVE_EVERY steps, resume if one exists
#
# Environment (all optional):
#   NP          ranks (default 4)                  PYTHON     interpreter (default: the repo's .venv, else python3)
#   MPIEXEC     mpiexec/mpirun to use (default: the venv's MPICH Hydra mpiexec, else the first on PATH)
#   CKPT        checkpoint directory; with it: --save "$CKPT" --save-every "$SAVE_EVERY" and, when
#               "$CKPT/latest" exists, --resume "$CKPT" (needs the checkpoint hooks of train_gpt.py wired)
#   SAVE_EVERY  default 50                          OMP_NUM_THREADS  default 1 per rank
#
# Ranks run as `python -m mpi4py SCRIPT` when mpi4py is installed, so one failing rank aborts the whole job
# instead of leaving the others waiting. Without any arguments the run is: gpt-tiny, grid 2x2x1x1 for NP=4
# (pure data parallel 1x1x1xNP otherwise), 30 steps on the shipped public-domain text.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$(dirname "$HERE")")"
NP="${NP:-4}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi
if [[ -z "${MPIEXEC:-}" ]]; then
  if [[ -x "$(dirname "$PYTHON")/mpiexec" ]]; then MPIEXEC="$(dirname "$PYTHON")/mpiexec"
  else MPIEXEC="$(command -v mpiexec || command -v mpirun || true)"; fi
fi
if [[ -z "$MPIEXEC" ]]; then
  echo "run_local.sh: no mpiexec found; pip install mpi4py mpich (or use: axgrid launch -n $NP -- ...)" >&2
  exit 2
fi

MPI_ARGS=(-n "$NP")
if "$MPIEXEC" --version 2>&1 | grep -qi "open mpi"; then
  MPI_ARGS+=(--oversubscribe -x OMP_NUM_THREADS -x PYTHONUNBUFFERED)
  [[ "$(id -u)" == 0 ]] && MPI_ARGS+=(--allow-run-as-root)
else
  MPI_ARGS+=(-genvall)          # MPICH Hydra: pass the environment to every rank
fi

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # a failed NCCL collective ends the job instead of hanging it (GPUs)

if [[ $# -eq 0 ]]; then
  if [[ "$NP" == 4 ]]; then GRID=2x2x1x1; else GRID="1x1x1x$NP"; fi
  set -- --model gpt-tiny --grid "$GRID" --data text --steps 30 --batch 8
fi
EXTRA=()
if [[ -n "${CKPT:-}" ]]; then
  EXTRA+=(--save "$CKPT" --save-every "${SAVE_EVERY:-50}")
  [[ -f "$CKPT/latest" ]] && EXTRA+=(--resume "$CKPT")
fi

RUNNER=("$PYTHON")
"$PYTHON" -c "import mpi4py" 2>/dev/null && RUNNER+=(-m mpi4py)
cd "$ROOT"
echo "run_local.sh: $MPIEXEC ${MPI_ARGS[*]} ${RUNNER[*]} experiments/train/train_gpt.py $* ${EXTRA[*]}"
exec "$MPIEXEC" "${MPI_ARGS[@]}" "${RUNNER[@]}" experiments/train/train_gpt.py "$@" "${EXTRA[@]}"
