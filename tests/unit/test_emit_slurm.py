"""``perfmodel rank --emit-slurm``: every GPU machine file gets a GPU script (its GPUs per node, one NCCL task per GPU,
nothing meant for gloo ranks on CPU cores), machines of CPU ranks keep local.sbatch; a Hugging Face decoder's row
runs experiments/train/pretrain.py with its config.json and the row's settings, read back by pretrain.py's own
argument parser from the command common.sh builds (``PRINT_COMMAND=1``).

tests/system/test_slurm.py submits a CPU-rank script to a private Slurm and checks the site scripts with
``sbatch --test-only``; no GPU script is submitted here (this host has no GPUs)."""
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from axgrid.perfmodel.cli import main
from axgrid.perfmodel.machines import CPU_RANK, known_machine_files, load_machine
from axgrid.perfmodel.slurm import SITE_TEMPLATES
from axgrid.spec import TransformerShape
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
MACHINE_FILES = known_machine_files()
GPU_MACHINES = sorted(n for n in MACHINE_FILES if load_machine(n).gpu != CPU_RANK)
CPU_MACHINES = sorted(n for n in MACHINE_FILES if load_machine(n).gpu == CPU_RANK)
#: options of the header meant for gloo ranks on CPU cores (local.sbatch's), and its CPU profile
CPU_RANK_SETTINGS = ("--cpus-per-task=1", "MACHINE=local-4", "--cpu-bind=none")


def sbatch_options(text: str) -> dict[str, str]:
    """The #SBATCH options of a script: {"-N": "2", "--gpus-per-node": "8", ...} (comments dropped)."""
    opts = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            words = line[len("#SBATCH "):].split("#")[0].split()
            name, _, value = words[0].partition("=")
            opts[name] = value or (words[1] if len(words) > 1 else "")
    return opts


def emit(tmp_path: Path, *args: str) -> list[Path]:
    out = tmp_path / "slurm"
    assert main(["rank", *args, "--layouts", "4d", "--emit-slurm", str(out)]) == 0
    return sorted(out.glob("row*.sbatch"))


def printed_command(script: Path, tmp_path: Path, tasks: int, per_node: int) -> list[str]:
    """The training command the script runs (common.sh's PRINT_COMMAND=1), in the environment Slurm gives a job of
    ``tasks`` tasks, ``per_node`` a node."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PRINT_COMMAND": "1", "SLURM_NTASKS": str(tasks),
           "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_CPUS_ON_NODE": str(8 * per_node), "SLURM_JOB_ID": "7",
           "SLURM_JOB_NAME": script.stem, "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_NUM_NODES": "1",
           "MASTER_ADDR": "localhost"}
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "runs").exists()                 # printing creates nothing
    lines = res.stdout.splitlines()
    return lines[lines.index("python"):]


@pytest.mark.parametrize("name", GPU_MACHINES)
def test_every_gpu_machine_file_gets_a_gpu_script(name, tmp_path):
    per_node = tomllib.loads(MACHINE_FILES[name].read_text())["gpus_per_node"]     # the file itself, as written
    scripts = emit(tmp_path, "--model", "gpt-tiny", "--gpus", str(2 * per_node), "--machine", name,
                   "--batch", str(4 * per_node), "--top", "2")
    assert scripts
    for script in scripts:
        text = script.read_text()
        opts = sbatch_options(text)
        assert (opts["-N"], opts["--ntasks-per-node"], opts["--gpus-per-node"]) == ("2", str(per_node), str(per_node))
        assert opts.get("--cpus-per-task") != "1" and not [s for s in CPU_RANK_SETTINGS if s in text]
        assert f"\nMACHINE={name}\n" in text and "\nexport NCCL_" in text and "--gpu-bind=" in text
        if load_machine(name).gpu.startswith("NVIDIA"):     # collectives start in the order they are posted
            assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1" in text
        template = SITE_TEMPLATES.get(name, "gpu.sbatch")
        assert f"Built on experiments/slurm/{template}" in text
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


@pytest.mark.parametrize("name", CPU_MACHINES)
def test_machines_of_cpu_ranks_keep_the_local_template(name, tmp_path):
    (script, *_) = emit(tmp_path, "--model", "gpt-tiny", "--gpus", "2", "--machine", name, "--batch", "4",
                        "--dtype", "fp32", "--top", "1")
    text = script.read_text()
    opts = sbatch_options(text)
    assert "--gpus-per-node" not in opts and opts["--cpus-per-task"] == "1" and opts["--ntasks-per-node"] == "2"
    assert "Built on experiments/slurm/local.sbatch" in text and f"\nMACHINE={name}\n" in text


def test_gpt_row_runs_train_gpt_with_its_settings(tmp_path):
    (script,) = emit(tmp_path, "--model", "gpt-tiny", "--gpus", "16", "--machine", "dgx-h100", "--batch", "64",
                     "--top", "1", "--no-recompute", "--zero", "1")
    grid = script.stem.split("_", 1)[1]
    argv = printed_command(script, tmp_path, 16, 8)
    assert argv[1] == "experiments/train/train_gpt.py"
    args = load_script("train/train_gpt.py").parse_args(argv[2:])
    assert (args.model, args.grid, args.batch, args.zero, args.recompute) == ("gpt-tiny", grid, 64, 1, False)


def test_public_decoder_row_runs_pretrain_with_its_config(tmp_path):
    """llama-3.1-8b has no file: its config.json is written beside the scripts, reads back as the same shape, and
    every row's command is pretrain.py's, with the row's grid, batch, micro-batches, zero and recompute."""
    scripts = emit(tmp_path, "--model", "llama-3.1-8b", "--gpus", "64", "--machine", "dgx-h100", "--batch", "512",
                   "--top", "2", "--json", str(tmp_path / "rank.json"))
    rows = json.loads((tmp_path / "rank.json").read_text())["rows"]
    config = tmp_path / "slurm" / "llama-3.1-8b" / "config.json"
    shape = TransformerShape.named("llama-3.1-8b")
    assert TransformerShape.from_config_json(str(config), shape.seq) == TransformerShape(
        "llama-3.1-8b", **{f: getattr(shape, f) for f in shape.__dataclass_fields__ if f != "name"} | {
            "path": str(config.resolve())})
    pretrain = load_script("train/pretrain.py")
    assert len(scripts) == 2
    for script in scripts:
        grid = script.stem.split("_", 1)[1]
        row = next(r for r in rows if r["grid"] == grid)
        argv = printed_command(script, tmp_path, 64, 8)
        assert argv[1] == "experiments/train/pretrain.py"
        args = pretrain.parse_args(argv[2:])
        assert (args.config, args.grid, args.batch, args.microbatches, args.zero, args.recompute, args.seq,
                args.dtype) == (str(config.resolve()), grid, 512, row["microbatches"], row["zero"], True, 8192, "bf16")
        assert "train_gpt.py" not in " ".join(argv) and "--vocab" not in argv


def test_config_row_points_to_the_given_file(tmp_path):
    """rank --config FILE --no-recompute: the script trains FILE (nothing written beside it) without recompute."""
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TransformerShape("tiny", 2, 64, 4, 128, 256, bias=False, ffn=128, family="llama",
                                                  kv_heads=2).hf_config()))
    (script,) = emit(tmp_path, "--config", str(config), "--gpus", "8", "--machine", "dgx-a100", "--batch", "16",
                     "--top", "1", "--no-recompute", "--seq", "128")
    assert sorted(p.name for p in (tmp_path / "slurm").iterdir()) == [script.name]
    argv = printed_command(script, tmp_path, 8, 8)
    args = load_script("train/pretrain.py").parse_args(argv[2:])
    assert (args.config, args.recompute, args.seq, args.grid) == (str(config), False, 128, script.stem.split("_")[1])


def test_a_sequence_longer_than_the_config_allows_is_refused_in_one_line(tmp_path, capsys):
    """pretrain.py refuses --seq above max_position_embeddings: the scripts are not written, the error says the fix."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TransformerShape("tiny", 2, 64, 4, 128, 256, bias=False, ffn=128, family="llama",
                                                     kv_heads=2).hf_config(), "max_position_embeddings": 128}))
    assert main(["rank", "--config", str(config), "--seq", "256", "--gpus", "8", "--machine", "dgx-h100", "--batch",
                 "16", "--layouts", "4d", "--emit-slurm", str(tmp_path / "slurm")]) == 2
    err = capsys.readouterr().err
    assert "--seq 256 is longer than" in err and "max_position_embeddings 128" in err and err.count("\n") == 1
    assert not (tmp_path / "slurm").exists()
