# The part of every axgrid sbatch template that is the same on every site: sourced by perlmutter.sbatch,
# frontier.sbatch, alps.sbatch, gpu.sbatch (any other GPU cluster) and local.sbatch after their #SBATCH header and
# SITE SETTINGS, so a change here shows in all of them (tests/system/test_slurm.py submits local.sbatch and checks
# the others with sbatch --test-only).
#
# The site part sets: SITE (a name for the log line), MACHINE (the perfmodel machine profile that picks the grid
# when GRID is empty), SRUN_ARGS (an array: the site's CPU/GPU binding options for srun), REPO (the checkout),
# RUN_DIR, and may override any default below before sourcing. Environment variables of the submission:
#   MODEL GRID BATCH MICRO STEPS SAVE_EVERY OVERLAP CKPT   what to train, where to save
#   CONFIG=PATH    a Hugging Face config.json (or its folder): pre-train that model with experiments/train/pretrain.py
#                  (MODEL then only names it; OVERLAP is train_gpt's); empty: axgrid's GPT MODEL with train_gpt.py
#   RECOMPUTE=0|1  activation recompute (--recompute) of every block; 1 by default
#   PRINT_COMMAND=1  print the training command (one word a line) and exit: nothing is queued, created or run
#   CHAIN=K        queue K follow-up jobs, one after another (each resumes from "$CKPT/latest")
#   NEXT_GRID=G    the follow-ups run on grid G (a checkpoint loads on any grid: it is resharded)
#   EXTRA_ARGS     more train_gpt.py (pretrain.py) arguments, split on spaces (e.g. "--layers 1 --hidden 32")
#
# Time limit and resume: `#SBATCH --signal=USR1@N` makes Slurm send SIGUSR1 to every task N s before the time
# limit (at its next time-limit check, which comes every 30 s); train_gpt.py and pretrain.py (with --save, through
# axgrid.checkpoint.SaveOnSignal) agrees on it at the next step boundary, writes a checkpoint and exits 0. The next
# link of the chain (submitted when this one starts, --dependency=afterany: it runs however this one ends)
# resumes from "$CKPT/latest". Checkpoints are atomic: a job killed mid-save leaves the previous one as latest.

MODEL="${MODEL:-gpt-5b}"
GRID="${GRID:-}"                    # GXxGYxGZxGD; empty: the perf model's best for this job's rank count
BATCH="${BATCH:-64}"
MICRO="${MICRO:-1}"
STEPS="${STEPS:-1000}"
SAVE_EVERY="${SAVE_EVERY:-100}"
OVERLAP="${OVERLAP:-oar,ors,oag,odp}"
CKPT="${CKPT:-$RUN_DIR/ckpt}"
CHAIN="${CHAIN:-0}"
NEXT_GRID="${NEXT_GRID:-$GRID}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
CONFIG="${CONFIG:-}"
RECOMPUTE="${RECOMPUTE:-1}"
PRINT_COMMAND="${PRINT_COMMAND:-0}"

# ---- chained jobs: queue the next link now, to start when this one ends for any reason ----
if (( CHAIN > 0 )) && [[ "$PRINT_COMMAND" != 1 ]]; then
  sbatch --dependency=afterany:"$SLURM_JOB_ID" --export=ALL,CHAIN=$((CHAIN - 1)),GRID="$NEXT_GRID" \
    -N "$SLURM_JOB_NUM_NODES" "$0"
fi

export TORCH_NCCL_ASYNC_ERROR_HANDLING=1     # a failed or timed-out collective crashes the job instead of hanging it
export PYTHONUNBUFFERED=1
# The ranks meet on the first node of the step (axgrid.launch.env reads it from SLURM_*, also under --mpi=pmi2/pmix or
# Cray's cray_shasta plugin); exporting it here names the same host, in case a site wrapper hides the node list.
export MASTER_ADDR="${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}"
# The flight recorder writes every rank's last collectives here when one fails or hangs (axgrid.launch.flight);
# read them with: python -m axgrid.launch.flight "$RUN_DIR"
export AXGRID_RUN_DIR="$RUN_DIR"

[[ "$PRINT_COMMAND" == 1 ]] || mkdir -p "$RUN_DIR"
cd "$REPO"
N=$SLURM_NTASKS
if [[ -n "$CONFIG" ]]; then
  PROBLEM=(--config "$CONFIG")                     # a Hugging Face model: pretrain.py builds it from its config
  TRAIN=(experiments/train/pretrain.py --config "$CONFIG")
else
  PROBLEM=(--model "$MODEL")                       # axgrid's GPT
  TRAIN=(experiments/train/train_gpt.py --model "$MODEL" --overlap "$OVERLAP")
fi
RECOMPUTE_ARG=()
[[ "$RECOMPUTE" == 1 ]] && RECOMPUTE_ARG=(--recompute)
if [[ -z "$GRID" ]]; then
  GRID=$(python -m axgrid.perfmodel rank "${PROBLEM[@]}" --gpus "$N" --machine "$MACHINE" --batch "$BATCH" --top 1 \
           --csv "$RUN_DIR/rank-$SLURM_JOB_ID.csv" >/dev/null && awk -F, 'NR==2{print $2}' "$RUN_DIR/rank-$SLURM_JOB_ID.csv")
fi
RESUME=()
[[ -f "$CKPT/latest" ]] && RESUME=(--resume "$CKPT")

echo "$SITE: $N ranks, model $MODEL, grid $GRID, batch $BATCH, resume: ${RESUME[*]:-no}"
# No terminal here: train_gpt prints a progress line (step, loss, tokens/s, time left) every 10 steps to the .out
# (--progress-every N in EXTRA_ARGS to change it).
# --kill-on-bad-exit=1: a task that fails ends the whole step at once (a hung rank's peers time out and fail;
# without it the step waits for the hung rank until the time limit). srun then exits 143 (the tasks it ended);
# the failing task's own code is in its "task R: Exited with exit code C" line.
# shellcheck disable=SC2086  # EXTRA_ARGS is split on purpose
COMMAND=(python "${TRAIN[@]}" --grid "$GRID" --batch "$BATCH" --microbatches "$MICRO" --steps "$STEPS"
         "${RECOMPUTE_ARG[@]}" --data synthetic --log "$RUN_DIR/train-$SLURM_JOB_ID.jsonl" --save "$CKPT"
         --save-every "$SAVE_EVERY" "${RESUME[@]}" $EXTRA_ARGS)
if [[ "$PRINT_COMMAND" == 1 ]]; then
  printf '%s\n' "${COMMAND[@]}"
  exit 0
fi
srun --kill-on-bad-exit=1 "${SRUN_ARGS[@]}" "${COMMAND[@]}"
