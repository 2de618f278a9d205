#!/usr/bin/env bash
# The GPU acceptance check of axgrid, as a user runs it on a fresh node (NVIDIA or AMD, 1 to 8 GPUs):
#
#     bash experiments/checks/gpu_check.sh --install      # first time: a venv with what is missing (torch included)
#     bash experiments/checks/gpu_check.sh                # then (or with PYTHON=... whose torch sees the GPUs)
#     bash experiments/checks/gpu_check.sh --gpus 4 --peak-tflops 989
#
# 1. Arguments are checked first (a bad one: one line, exit 2); --help prints this.
# 2. Python: $PYTHON, else the check's own venv (--venv DIR, default .venv-gpu-check) when it exists, else python3.
#    What the check needs is checked without importing torch: torch, numpy, transformers, safetensors, and on
#    NVIDIA nvidia-ml-py (energy). Missing ones: without --install the one command that installs them is printed
#    (exit 2); with --install the venv is made (it sees the packages of the Python it was made from, e.g. a site's
#    PyTorch module) and the missing ones are pip-installed into it: torch from PyPI (a CUDA build) on NVIDIA, from
#    $TORCH_INDEX_URL (default the ROCm index below) on AMD; amdsmi comes with ROCm (/opt/rocm/share/amd_smi).
# 3. A GPU: an NVIDIA device node or nvidia-smi, or AMD's /dev/kfd; none: one line, exit 2, in seconds.
# 4. experiments/checks/gpu_check.py: GPU 0 (device, NCCL/RCCL, GEMM tuner, bf16 GPT steps with MFU, memory and
#    energy, memory against perfmodel, from_pretrained onto the GPU), and with 2-8 GPUs train_gpt --overlap all on
#    several grids against serial, the NCCL timeout with the flight recorder, MFU/memory/energy on all of them.
#    It ends with one Markdown table to paste into docs/results.md.
# AMD: MI250X (8 GCDs per node, each a device) and MI300X are in axgrid's peak table; RCCL answers as "nccl".
# Sizes: GPU_CHECK_HIDDEN, GPU_CHECK_LAYERS, GPU_CHECK_SEQ, GPU_CHECK_BATCH, GPU_CHECK_STEPS (or --quick).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO="$PWD"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fail() { echo "gpu_check: FAIL: $*" >&2; exit 2; }

INSTALL=0
VENV="${GPU_CHECK_VENV:-$REPO/.venv-gpu-check}"
PASS=()
while (($#)); do
    case "$1" in
        --install) INSTALL=1 ;;
        --venv) [[ $# -ge 2 ]] || fail "--venv needs a directory"; VENV="$2"; shift ;;
        --venv=*) VENV="${1#--venv=}" ;;
        -h|--help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0 ;;
        *) PASS+=("$1") ;;
    esac
    shift
done

# ---- Python ----------------------------------------------------------------------------------------------------
if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -x "$VENV/bin/python" ]]; then
    PY="$VENV/bin/python"
else
    PY="$(command -v python3 || command -v python || true)"
fi
[[ -n "$PY" ]] && command -v "$PY" >/dev/null 2>&1 \
    || fail "no python3 on PATH (load your site's Python, e.g. module load python, or set PYTHON=...)"
"$PY" experiments/checks/gpu_check.py --parse-only ${PASS[@]+"${PASS[@]}"} || exit $?

VENDOR=none
if ls /dev/nvidia0 >/dev/null 2>&1 || command -v nvidia-smi >/dev/null 2>&1; then VENDOR=nvidia
elif [[ -e /dev/kfd ]] || command -v amd-smi >/dev/null 2>&1 || command -v rocm-smi >/dev/null 2>&1; then VENDOR=amd
fi
ROCM_INDEX="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/rocm6.4}"

missing() {     # the packages the check needs that "$1" cannot import (without importing torch)
    "$1" - "$VENDOR" <<'EOF'
import importlib.util, sys
need = {"torch": "torch", "numpy": "numpy", "transformers": "transformers", "safetensors": "safetensors"}
if sys.argv[1] == "nvidia":
    need["pynvml"] = "nvidia-ml-py"
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
EOF
}
install_cmd() { # how the missing packages $@ are installed for python $PY_TARGET
    local torch_args=()
    if [[ " $* " == *" torch "* && $VENDOR == amd ]]; then torch_args=(--index-url "$ROCM_INDEX"); fi
    local rest=()
    for p in "$@"; do [[ $p == torch ]] || rest+=("$p"); done
    [[ " $* " == *" torch "* ]] && echo "\"$PY_TARGET\" -m pip install torch ${torch_args[*]-}"
    ((${#rest[@]})) && echo "\"$PY_TARGET\" -m pip install ${rest[*]}"
    return 0
}

read -r -a MISSING <<<"$(missing "$PY")"
if ((INSTALL)); then
    if [[ ! -x "$VENV/bin/python" ]]; then
        "$PY" -m venv --without-pip "$VENV" || fail "could not make the venv $VENV with $PY"
        # the new venv sees the packages of the Python it was made from (a site's PyTorch module, its numpy, pip)
        site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        "$PY" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])' \
            | awk '!seen[$0]++' >"$site/gpu_check_base.pth"
    fi
    PY="$VENV/bin/python"
    read -r -a MISSING <<<"$(missing "$PY")"
    if ((${#MISSING[@]})); then
        PY_TARGET="$PY"
        "$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip -q || fail "no pip for $PY (python3 -m ensurepip)"
        while read -r cmd; do
            echo "gpu_check: installing: $cmd"
            eval "$cmd" || fail "installing failed: $cmd"
        done < <(install_cmd "${MISSING[@]}")
        [[ $VENDOR == amd && -d /opt/rocm/share/amd_smi ]] && "$PY" -m pip install -q /opt/rocm/share/amd_smi || true
    fi
    version="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo missing)"
    echo "gpu_check: venv $VENV ready (torch $version)"
elif ((${#MISSING[@]})); then
    by_hand="$(PY_TARGET="$PY" install_cmd "${MISSING[@]}" | sed ':a;N;$!ba;s/\n/ \&\& /g')"
    fail "$PY lacks ${MISSING[*]}; install them with: bash experiments/checks/gpu_check.sh --install   (or: $by_hand)"
fi

# ---- a GPU -----------------------------------------------------------------------------------------------------
[[ $VENDOR != none ]] \
    || fail "no GPU on this machine (no /dev/nvidia0 or nvidia-smi, no /dev/kfd); this check needs 1 to 8 NVIDIA or AMD" \
            "GPUs"
if [[ $VENDOR == amd ]]; then
    export HSA_FORCE_FINE_GRAIN_PCIE="${HSA_FORCE_FINE_GRAIN_PCIE:-1}"   # RCCL's host buffers (MI250X, MI300X)
fi
exec "$PY" experiments/checks/gpu_check.py ${PASS[@]+"${PASS[@]}"}
