"""sbatch scripts for the rows of a printed ranking (``rank --emit-slurm DIR``), built on the site templates of
``experiments/slurm/`` (the original system launched its top configurations as short jobs).

Each 4D row of the printed table gets ``rowNN_GRID.sbatch``, NN its row number there (a TP×PP×DP row gets none: axgrid
has no pipeline parallelism). The script is the machine's template -- ``perlmutter.sbatch``, ``frontier.sbatch``,
``alps.sbatch``; ``gpu.sbatch`` (NCCL ranks, one task per GPU, whole nodes) for every other GPU machine file, such as
dgx-h100, dgx-a100 and juwels-booster; ``local.sbatch`` (gloo ranks on CPU cores) for a machine of CPU ranks -- with:

- the row's header: job name, nodes, tasks (and GPUs) per node, a 30-minute limit, the output file; the template's
  other options stay, ``--signal=USR1@N`` among them (save a checkpoint and exit before the limit);
- ``MACHINE`` (the profile that picks a grid when ``GRID`` is emptied) and ``SITE`` set to the machine's name;
- no account and no constraint in the header: sbatch reads them from ``SBATCH_ACCOUNT`` and ``SBATCH_CONSTRAINT``
  at submission (the script's first lines say so), so it submits under any account as written;
- the template's site settings (modules, environment, network variables) as they are: check them once;
- the row's run as defaults that the environment of the submission may override: MODEL, GRID, BATCH, MICRO,
  OVERLAP, RECOMPUTE (as priced), STEPS (20: a trial run), EXTRA_ARGS (sizes, dtype, --zero); ``common.sh`` does the
  rest: checkpoints under ``$CKPT``, a resume from ``$CKPT/latest`` when one exists, chained jobs (``CHAIN=K``), the
  srun line;
- for a Hugging Face decoder (``--config``, or a public model such as llama-3.1-8b), ``CONFIG``: its config.json,
  which ``common.sh`` hands to ``experiments/train/pretrain.py`` instead of train_gpt.py. A public model named
  without a file gets ``NAME/config.json`` beside the scripts (``TransformerShape.hf_config``).

The templates, train_gpt.py and pretrain.py live in a checkout (experiments/ is not installed): the scripts run from
one, and ``REPO`` defaults to the checkout that wrote them. For a machine of CPU ranks the script asks for tasks, not
GPUs, so it runs on a Slurm without GPUs (tests/system/test_slurm.py submits one, of the GPT and of a tiny Llama).
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import PerfModelError
from .machines import CPU_RANK, Machine
from .rank import Ranking, Row
from .units import device_word, flops, memory_unit

#: The checkout that holds experiments/slurm/ (this file is axgrid/perfmodel/slurm.py in it).
CHECKOUT = Path(__file__).resolve().parents[2]
SLURM_DIR = CHECKOUT / "experiments" / "slurm"
#: The machines with a site template of their own; the other GPU machines build on gpu.sbatch, machines of CPU ranks
#: on local.sbatch.
SITE_TEMPLATES = {"perlmutter": "perlmutter.sbatch", "frontier": "frontier.sbatch", "alps": "alps.sbatch"}
GPU_TEMPLATE = "gpu.sbatch"
CPU_TEMPLATE = "local.sbatch"
#: #SBATCH options a script sets for its row (the template's are dropped).
ROW_OPTIONS = ("-J", "--job-name", "-N", "--nodes", "--ntasks-per-node", "--gpus-per-node", "-t", "--time", "-o",
               "--output")
#: #SBATCH options left to the submission (``SBATCH_ACCOUNT``, ``SBATCH_CONSTRAINT``).
SUBMISSION_OPTIONS = ("-A", "--account", "-C", "--constraint")
#: The variables of common.sh a script sets for its row (the template's own defaults of them are dropped).
RUN_VARIABLES = ("MODEL", "CONFIG", "GRID", "BATCH", "MICRO", "OVERLAP", "RECOMPUTE", "STEPS", "EXTRA_ARGS")
#: The template's lines that name the machine (set to the row's machine).
MACHINE_VARIABLES = ("SITE", "MACHINE")
#: The dtypes the training drivers take (``--dtype``); a row priced in another trains in bf16.
DRIVER_DTYPES = ("fp32", "bf16")
TRIAL_STEPS = 20
TRIAL_MINUTES = 30


def template_for(machine: Machine) -> Path:
    """The site template a script for ``machine`` is built on."""
    default = CPU_TEMPLATE if machine.gpu == CPU_RANK else GPU_TEMPLATE
    path = SLURM_DIR / SITE_TEMPLATES.get(machine.name, default)
    if not path.is_file():
        raise PerfModelError(f"--emit-slurm builds on the site templates in experiments/slurm/ of a checkout, and "
                             f"{path} is missing: run it from an axgrid checkout")
    return path


def _option(line: str) -> str:
    """``-N`` of ``#SBATCH -N 16   # comment``, ``--signal`` of ``#SBATCH --signal=USR1@120``."""
    return line[len("#SBATCH "):].split("#")[0].split()[0].partition("=")[0]


def config_path(rk: Ranking, outdir: str | Path) -> Path | None:
    """The config.json a script of ``rk``'s model trains from: None for the GPT; the file the shape was read from;
    else (a public model named without a file) ``outdir/NAME/config.json``, written by :func:`emit_slurm`."""
    shape = rk.problem.model
    if shape.is_gpt:
        return None
    if shape.path:
        return Path(shape.path)
    return Path(outdir).resolve() / shape.name / "config.json"


def sbatch_script(rk: Ranking, row: Row, number: int, command: str, steps: int = TRIAL_STEPS,
                  minutes: int = TRIAL_MINUTES, config: Path | None = None) -> str:
    """The script of ``row``, row ``number`` of the table ``command`` printed (see the module docstring); ``config``:
    the config.json of a Hugging Face decoder (:func:`config_path`), None for the GPT."""
    p, m = rk.problem, rk.machine
    if row.layout != "4D":
        raise PerfModelError(f"{row.grid_str} is a TP×PP×DP layout: axgrid runs 4D grids only")
    template = template_for(m)
    nodes, per_node = -(-p.gpus // m.gpus_per_node), min(p.gpus, m.gpus_per_node)
    name = f"axgrid-{p.model.name}-{row.grid_str}"
    dev = device_word(m)
    mem_unit, mem_per = memory_unit([row.memory_bytes])
    header = [f"#SBATCH -J {name}", f"#SBATCH -N {nodes}", f"#SBATCH --ntasks-per-node={per_node}"]
    header += [] if m.gpu == CPU_RANK else [f"#SBATCH --gpus-per-node={per_node}"]
    header += [f"#SBATCH -t 00:{minutes:02d}:00", "#SBATCH -o %x-%j.out"]
    decoder = not p.model.is_gpt
    if decoder and config is None:
        raise PerfModelError(f"--emit-slurm: {p.model.name} is a Hugging Face {p.model.family} model: its script "
                             f"needs the config.json pretrain.py builds it from")
    dtype = p.dtype if p.dtype in DRIVER_DTYPES else "bf16"
    extra = f"--seq {p.model.seq}" + ("" if decoder else f" --vocab {p.model.vocab}") + f" --dtype {dtype}"
    if row.zero:
        extra += f" --zero {row.zero}"               # the zero mode perfmodel priced this row with
    if not decoder and (not p.model.name or p.model.name == "custom"):
        extra = f"--layers {p.model.layers} --hidden {p.model.hidden} --heads {p.model.heads} {extra}"
    model = p.model.name if p.model.name and p.model.name != "custom" else "gpt-tiny"
    run = [f"# ---- the row's run (perfmodel rank row {number}); the submission's environment may override any ----",
           f'MODEL="${{MODEL:-{model}}}"']
    if decoder:
        run.append(f'CONFIG="${{CONFIG:-{config}}}"   # pre-trained by experiments/train/pretrain.py')
    run += [f'GRID="${{GRID:-{row.grid_str}}}"', f'BATCH="${{BATCH:-{p.batch}}}"',
            f'MICRO="${{MICRO:-{row.microbatches}}}"', f'OVERLAP="${{OVERLAP:-{p.options.overlap_spec()}}}"',
            f'RECOMPUTE="${{RECOMPUTE:-{int(p.options.recompute)}}}"                  # as priced',
            f'STEPS="${{STEPS:-{steps}}}"                      # a trial run; a real one: STEPS=N (and CHAIN=K)',
            f'EXTRA_ARGS="${{EXTRA_ARGS:-{extra}}}"']
    if dtype != p.dtype:
        run.append(f"# (priced in {p.dtype}; the training drivers take {' or '.join(DRIVER_DTYPES)}: {dtype} here)")
    dropped: list[str] = []
    body: list[str] = []
    seen_header = False
    for line in template.read_text().splitlines():
        if line.startswith("#SBATCH "):
            opt = _option(line)
            if not seen_header:
                body += header
                seen_header = True
            if opt in SUBMISSION_OPTIONS:
                dropped.append(line[len("#SBATCH "):].split("#")[0].strip())
            if opt in ROW_OPTIONS or opt in SUBMISSION_OPTIONS:
                continue
        elif not seen_header:
            continue                                    # the template's own comment block: ours replaces it
        if line.split("=", 1)[0] in RUN_VARIABLES:
            continue                                    # the template's defaults of what the row sets
        if line.split("=", 1)[0] in MACHINE_VARIABLES:
            line = f"{line.split('=', 1)[0]}={m.name}"
        if line.startswith('REPO="${REPO:-'):
            line = f'REPO="${{REPO:-{CHECKOUT}}}"   # the checkout that wrote this script'
        body.append(line)
        if line.strip() == "set -euo pipefail":
            body += [""] + run
    account = (f"SBATCH_ACCOUNT=<account> {'SBATCH_CONSTRAINT=<constraint> ' if '-C' in ' '.join(dropped) else ''}"
               if dropped else "")
    intro = [
        "#!/bin/bash",
        f"# Row {number} of `{command}`:",
        f"#   {row.grid_str} on {nodes} node(s) x {per_node} {dev}s: predicted {row.time_s:.4g} s/batch (model error "
        f"band {row.time_low:.4g}-{row.time_high:.4g} s), {flops(row.tflops_per_gpu, dev)}, "
        f"{row.memory_bytes / mem_per:.3g} {mem_unit}/{dev}, {row.microbatches} micro-batch(es), on {m.name}",
        f"# Built on experiments/slurm/{template.name}: check its site settings below once. Submit with",
        f"#   {account}sbatch <this file>",
        *([f"# (sbatch reads the account and constraint from those variables; the template's were: "
           f"{'; '.join(dropped)})"] if dropped else []),
        "# Checkpoints go to $CKPT (default $RUN_DIR/ckpt); a job started again resumes from $CKPT/latest; SIGUSR1",
        "# before the time limit saves one and exits; CHAIN=K queues K follow-ups (experiments/slurm/common.sh).",
    ]
    return "\n".join(intro + body) + "\n"


def emit_slurm(rk: Ranking, outdir: str | Path, rows: list[Row], command: str) -> list[Path]:
    """Write ``rowNN_GRID.sbatch`` for every 4D row of ``rows`` (the printed table, row NN = its position from 1),
    and the config.json of a public Hugging Face model named without one (:func:`config_path`); returns the paths."""
    if not any(r.layout == "4D" for r in rows):
        raise PerfModelError(f"--emit-slurm: none of the {len(rows)} rows printed is a 4D grid, the layouts axgrid "
                             f"runs; use --layouts 4d, or a larger --top")
    d = Path(outdir)
    config = config_path(rk, d)
    if config is not None:
        limit, seq = rk.problem.model.hf_config().get("max_position_embeddings"), rk.problem.model.seq
        if limit and seq > limit:
            raise PerfModelError(f"--seq {seq} is longer than {config}'s max_position_embeddings {limit}, which "
                                 f"pretrain.py refuses: rank with --seq {limit} or less, or raise it in the config")
    d.mkdir(parents=True, exist_ok=True)
    out = []
    if config is not None and not rk.problem.model.path:    # a public model named without its file
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps(rk.problem.model.hf_config(), indent=2) + "\n")
        out.append(config)
    for number, row in enumerate(rows, 1):
        if row.layout == "4D":
            f = d / f"row{number:02d}_{row.grid_str}.sbatch"
            f.write_text(sbatch_script(rk, row, number, command, config=config))
            out.append(f)
    return out
