"""examples/fabric_train.py started as users start it, by each launcher the strategy meets (Fabric's cluster
environments), and trained to the losses of serial training on 4 ranks (srun) or 2 (the others):

- Fabric's own launcher: ``python examples/fabric_train.py`` re-runs itself in a second process (LightningEnvironment);
- torchrun: ``torchrun --standalone --nproc-per-node 2 ...`` (TorchElasticEnvironment);
- srun, on the private one-node Slurm cluster (axgrid/testing/slurm.py): ``srun --ntasks-per-node 4 python ...``
  (SLURMEnvironment); the same with 2 tasks in a job named ``interactive``, which Fabric leaves to its own launcher
  (each task would have started processes of its own) and AxgridStrategy runs as the srun task it is; and
  ``python examples/fabric_train.py`` in a batch script without srun, which Fabric takes for task 0 of 4 (it would
  wait for 3 ranks that never come), and mpiexec inside a batch script, whose ranks Fabric all reads as rank 0 of
  SLURM_NTASKS: one line naming the fix, at once.

Each run that trains prints which environment Fabric chose, the losses (equal to serial training's: the ranks formed
one world; grid 2x1x1x2 splits every layer over x and the batch over d, 1x1x1x2 the batch), and every rank's grid
coordinate and the windows it read: the ranks of one d-group read the same ones, the two d-groups each half of every
step's batch. One launcher (srun) runs the 4-rank grid; the others show their environment and one world on 2 ranks,
which is what differs between launchers (fewer processes importing torch and Fabric side by side on 2 cores).

Every launch of the module runs side by side: the two local ones start with the module (``local_runs``), the Slurm
ones with the first Slurm test (``slurm_jobs``; those tests come first); each test checks its own launch."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import time
from functools import partial

import pytest

from helpers.fabric_serial import serial_fabric_losses
from helpers.side_by_side import outcome, side_by_side

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = "examples/fabric_train.py"
ARGV = ["--grid", "1x1x1x2", "--zero", "1", "--steps", "2", "--batch", "4", "--seq", "16"]
ARGV4 = ["--grid", "2x1x1x2", "--zero", "1", "--steps", "2", "--batch", "4", "--seq", "16"]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                 "NODE_RANK", "TORCHELASTIC_RUN_ID")
RUN_LIMIT_S = 420.0        # one launch (4 processes importing torch, transformers and Fabric on a loaded 2-core host)


def plain_env(base: dict) -> dict:
    env = {k: v for k, v in base.items() if k not in LAUNCHER_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def printed_losses(out: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step \d+: loss ([0-9.]+)$", out, re.M)]


def assert_trained(out: str, environment: str, ranks: int = 4) -> None:
    """The example's output: Fabric chose ``environment`` for one world of ``ranks`` (4: grid 2x1x1x2, 2: grid
    1x1x1x2), the losses are serial training's, and the sampler gave the ranks of one d-group the same windows, each
    d-group its own half of every step."""
    grid = {4: "2x1x1x2", 2: "1x1x1x2"}[ranks]
    assert re.search(rf"^fabric_train: {ranks} ranks \({environment}\), grid {grid}, precision 32-true$", out, re.M), out
    assert len(re.findall(r"^fabric_train: ", out, re.M)) == 1, out            # one world, one rank 0
    want = serial_fabric_losses(steps=2, batch=4, seq=16)
    assert printed_losses(out) == pytest.approx(want, rel=1e-4), (out, want)
    line = re.search(r"^read by rank \(x,y,z,d\): (.*)$", out, re.M)
    assert line, out
    read = {int(r): (tuple(map(int, c.split(", "))), [int(w) for w in rows.split(", ")])
            for r, c, rows in re.findall(r"(\d+) \(([\d, ]+)\): \[([\d, ]+)\]", line.group(1))}
    assert sorted(read) == list(range(ranks)), line.group(0)
    by_d: dict[int, set] = {}
    for coord, rows in read.values():
        by_d.setdefault(coord[3], set()).add(tuple(rows))
    assert sorted(by_d) == [0, 1] and all(len(v) == 1 for v in by_d.values()), line.group(0)   # alike in a d-group
    halves = [set(next(iter(v))) for v in by_d.values()]
    assert not halves[0] & halves[1] and halves[0] | halves[1] == set(range(8)), line.group(0)
    coords = [(0, 0, 0, 0), (0, 0, 0, 1), (1, 0, 0, 0), (1, 0, 0, 1)] if ranks == 4 else [(0, 0, 0, 0), (0, 0, 0, 1)]
    assert sorted(c for c, _ in read.values()) == coords


# ---- Fabric's launcher and torchrun, on this machine ----------------------------------------------------------
def local_run(argv: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=plain_env(dict(os.environ)), capture_output=True, text=True,
                          timeout=RUN_LIMIT_S)


@pytest.fixture(scope="module", autouse=True)
def local_runs(tmp_path_factory):
    """Fabric's launcher (2 ranks) and torchrun (4 ranks), started with the module's first test (when
    lightning_fabric is installed), beside the Slurm launches: futures of their CompletedProcess."""
    if importlib.util.find_spec("lightning_fabric") is None:
        yield {}
        return
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    calls = {"fabric": partial(local_run, [sys.executable, str(ROOT / EXAMPLE), *ARGV],
                               tmp_path_factory.mktemp("fabric-launcher")),
             "torchrun": partial(local_run, [torchrun, "--standalone", "--nproc-per-node", "2", str(ROOT / EXAMPLE),
                                             *ARGV], tmp_path_factory.mktemp("torchrun"))}
    with side_by_side(calls) as started:
        yield started


# ---- srun, on the private Slurm cluster ------------------------------------------------------------------------
BATCH_ONE_LINE = ("fabric_train: axgrid's launch table finds no launcher (one process on its own) "
                  "(axgrid.launch.env.read_placement); Fabric chose SLURMEnvironment, which reads this process as "
                  "rank 0 of 4: start it with srun (srun --ntasks-per-node=N python ...)")


@pytest.fixture(scope="module")
def slurm_jobs(slurm, tmp_path_factory):
    """The four Slurm launches, side by side: futures of their output. Every job is scancel-ed by name at the end (a
    no-op when it finished), so a launch that timed out leaves nothing running on the cluster."""
    pytest.importorskip("lightning_fabric")
    tmp = tmp_path_factory.mktemp("fabric-slurm")
    env = plain_env(slurm.env)
    batch = tmp / "fabric.sbatch"
    batch.write_text("#!/bin/bash\n#SBATCH --ntasks-per-node=4\n#SBATCH -t 5\n"
                     f"#SBATCH -o {tmp}/fabric-batch-%j.out\n"
                     f"cd {ROOT}\npython {EXAMPLE} {' '.join(ARGV4)}\n")
    mpiexec = tmp / "fabric-mpiexec.sbatch"
    mpiexec.write_text("#!/bin/bash\n#SBATCH --ntasks-per-node=2\n#SBATCH -t 5\n"
                       f"#SBATCH -o {tmp}/fabric-mpiexec-%j.out\n"
                       f"cd {ROOT}\nmpiexec -launcher fork -n 2 python {EXAMPLE} {' '.join(ARGV)}\n")

    def srun(name: str, tasks: int, argv: list[str]) -> str:
        res = subprocess.run(["srun", "-J", name, "--kill-on-bad-exit=1", "--ntasks-per-node", str(tasks), "python",
                              EXAMPLE, *argv], env=env,
                             cwd=ROOT, capture_output=True, text=True, timeout=RUN_LIMIT_S)
        return f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"

    def sbatch(name: str, script: pathlib.Path) -> str:
        job = slurm.sbatch("-J", name, str(script), env=env, cwd=tmp)
        started = time.monotonic()
        rec = slurm.wait_done(job, timeout_s=RUN_LIMIT_S)
        took = time.monotonic() - started
        return f"{rec.state} {rec.exit_code} {took:.0f}s\n{(tmp / f'{name}-{job}.out').read_text()}"

    calls = {"srun": partial(srun, "fabric-srun", 4, ARGV4),
             "interactive": partial(srun, "interactive", 2, ARGV),
             "batch": partial(sbatch, "fabric-batch", batch),
             "mpiexec": partial(sbatch, "fabric-mpiexec", mpiexec)}
    try:
        with side_by_side(calls) as started:
            yield started
    finally:
        for name in ("fabric-srun", "interactive", "fabric-batch", "fabric-mpiexec"):
            slurm.command(["scancel", "--name", name], check=False)


@pytest.mark.slurm
@pytest.mark.timeout(2 * RUN_LIMIT_S)
def test_srun_tasks_train_as_serially_with_fabrics_slurm_environment(slurm_jobs):
    """``srun --ntasks-per-node 4 python examples/fabric_train.py``: Fabric's SLURMEnvironment, its ranks and
    world the srun tasks' (as axgrid's launch table reads them), one world of 4."""
    out = outcome(slurm_jobs["srun"], timeout_s=RUN_LIMIT_S + 60)
    assert out.startswith("exit 0"), out
    assert_trained(out, "SLURMEnvironment", ranks=4)


@pytest.mark.slurm
@pytest.mark.timeout(2 * RUN_LIMIT_S)
def test_srun_tasks_of_an_interactive_job_train_as_one_world(slurm_jobs):
    """``srun -J interactive --ntasks-per-node 2 ...``: Fabric would leave each task to its own launcher (2 worlds
    of 2, each training alone); the strategy runs each task as the srun task it is: one world of 2, the same losses.
    (2 tasks show one world as 4 do; the 4-rank grid's windows are the plain srun test's.)"""
    out = outcome(slurm_jobs["interactive"], timeout_s=RUN_LIMIT_S + 60)
    assert out.startswith("exit 0"), out
    assert_trained(out, "SLURMEnvironment", ranks=2)


@pytest.mark.slurm
@pytest.mark.timeout(2 * RUN_LIMIT_S)
def test_python_in_a_batch_script_without_srun_says_one_line_at_once(slurm_jobs):
    """The batch script's own step (SLURM_NTASKS=4, SLURM_PROCID=0, no srun step): Fabric reads rank 0 of 4 and
    would wait for the others until the timeout; the strategy says the fix before any process group."""
    out = outcome(slurm_jobs["batch"], timeout_s=RUN_LIMIT_S + 60)
    head, text = out.split("\n", 1)
    state, code, took = head.split()
    assert (state, code) == ("FAILED", "1:0"), out
    assert BATCH_ONE_LINE in text.splitlines(), out
    assert "Traceback" not in text and "step 0" not in text, out
    assert float(took[:-1]) < 120, out           # not the 120 s collective timeout: before any process group


@pytest.mark.slurm
@pytest.mark.timeout(2 * RUN_LIMIT_S)
def test_mpiexec_inside_a_batch_script_says_one_line_at_once(slurm_jobs):
    """Hydra's ``mpiexec -launcher fork -n 2`` in a batch script: both ranks see the batch step's SLURM_PROCID=0, so
    Fabric's SLURMEnvironment makes each of them rank 0 of 2 (one would wait for the other until the timeout);
    refused on both, said once (by rank 0), before any process group."""
    out = outcome(slurm_jobs["mpiexec"], timeout_s=RUN_LIMIT_S + 60)
    head, text = out.split("\n", 1)
    state, code, took = head.split()
    assert state == "FAILED" and code != "0:0", out
    said = [line for line in text.splitlines() if "axgrid's launch table finds" in line]
    assert said == ["fabric_train: axgrid's launch table finds mpich's rank 0 of 2, local rank 0 of 2 "
                    "(axgrid.launch.env.read_placement); Fabric chose SLURMEnvironment, which reads this process as "
                    "rank 0 of 2: start the ranks with srun instead of mpich, or give AxgridStrategy("
                    "cluster_environment=...) for mpich"], out
    assert "Traceback" not in text and "step 0" not in text, out
    assert float(took[:-1]) < 120, out


# ---- the local launches' checks (after the Slurm ones: both ran side by side) -----------------------------
@pytest.mark.timeout(RUN_LIMIT_S + 60)
def test_fabric_launcher_starts_the_ranks_and_trains_as_serially(local_runs):
    pytest.importorskip("lightning_fabric")
    run = outcome(local_runs["fabric"], timeout_s=RUN_LIMIT_S)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "fabric_train: 2 ranks (LightningEnvironment), grid 1x1x1x2" in run.stdout, run.stdout
    want = serial_fabric_losses(steps=2, batch=4, seq=16)
    assert printed_losses(run.stdout) == pytest.approx(want, rel=1e-4), (run.stdout, want)


@pytest.mark.timeout(RUN_LIMIT_S + 60)
def test_torchrun_starts_the_ranks_that_train_as_serially(local_runs):
    """``torchrun --standalone --nproc-per-node 2``: Fabric's TorchElasticEnvironment, whose ranks the strategy
    checked against axgrid's launch table (the torchrun row) before the process group: one world of 2 (the 4-rank
    grid's windows are the srun test's)."""
    pytest.importorskip("lightning_fabric")
    run = outcome(local_runs["torchrun"], timeout_s=RUN_LIMIT_S)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert_trained(run.stdout, "TorchElasticEnvironment", ranks=2)
