"""Real Slurm jobs on a private one-node cluster (the ``slurm`` fixture: axgrid/testing/slurm.py).

- ``srun`` launches: the demo and train_gpt on 4 ranks; every rank finds its place from ``SLURM_*``; the demo again
  on 2 ranks under ``srun --mpi=pmi2`` (which adds ``PMI_*`` as Cray's plugin does) with no ``MASTER_ADDR``, matching
  serial.
- The reliability table under srun (axgrid/testing/faults.py, 2 ranks, run side by side as separate jobs): a rank raises,
  stops on one of the project's errors (said once, by it), is SIGKILLed, hangs (collective timeout 5 s), or the job is
  ``scancel``-ed; with and without
  ``--kill-on-bad-exit=1``; exit codes, what Slurm recorded, and that no process of the job is left.
- experiments/slurm/local.sbatch: SIGUSR1 before a 1-minute time limit saves through SaveOnSignal and exits 0;
  with CHAIN=1 the follow-up (``--dependency=afterany``) resumes from ``latest`` on another grid; the losses of
  the chain equal an uninterrupted run's, step for step.
- ``perfmodel rank --emit-slurm`` for the local machine profile writes a script that runs here as written (progress
  lines in the .out, a checkpoint at the end), and so does one of a tiny Llama's config.json (pretrain.py); for
  Perlmutter, Frontier, Alps and DGX H100 (gpu.sbatch; a GPT and Llama-3.1-8B, whose script runs pretrain.py) its
  scripts pass ``sbatch --test-only``. No GPU script is submitted: this node has no GPUs.
- The site templates and gpu.sbatch pass ``sbatch --test-only`` here with the options this node cannot satisfy
  overridden (nodes, GPUs, partition, constraint); those and the srun options are parsed and checked.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from axgrid.testing.faults import run_job, srun_case
from axgrid.testing.slurm import ROOT

pytestmark = pytest.mark.slurm

SLURM_DIR = ROOT / "experiments" / "slurm"
SITES = ("perlmutter", "frontier", "alps")
#: the GPU templates: the sites' and the one every other GPU machine file builds on
GPU_TEMPLATES = SITES + ("gpu",)
#: (machine, model) -> the template its --emit-slurm scripts build on
EMITTED = {("perlmutter", "gpt-20b"): "perlmutter", ("frontier", "gpt-20b"): "frontier", ("alps", "gpt-20b"): "alps",
           ("dgx-h100", "gpt-20b"): "gpu", ("dgx-h100", "llama-3.1-8b"): "gpu"}
TINY = "--layers 1 --hidden 32 --heads 2 --seq 16"     # train_gpt.py model overrides: a few ms per step
RUN_LIMIT_S = 480.0        # any one job here (start-up of 4 torch processes on a loaded 2-core machine is slow)


def srun(slurm, args: list[str], timeout_s: float = RUN_LIMIT_S) -> subprocess.CompletedProcess:
    return subprocess.run(["srun", *args], env=slurm.env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s)


def records(log: Path) -> list[dict]:
    """The step records of a train_gpt.py JSON-lines log."""
    if not log.exists():
        return []
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("event") == "step"]


# ---- srun launches ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def launches(slurm):
    """The demo, train_gpt and a print of detect_launch(), each `srun -n 4`, run side by side."""
    jobs = {
        "demo": ["-n", "4", "--kill-on-bad-exit=1", "-J", "demo", "python", "-m", "axgrid.demo", "--grid", "2x2x1x1",
                 "--steps", "3"],
        "train": ["-n", "4", "--kill-on-bad-exit=1", "-J", "train", "python", "experiments/train/train_gpt.py",
                  "--grid", "2x1x1x2", "--steps", "3", "--batch", "4", "--no-progress", *TINY.split()],
        "detect": ["-n", "4", "-J", "detect", "python", "-c",
                   "from axgrid.launch.env import detect_launch; print(detect_launch(use_mpi=False))"],
        "pmi2": ["--mpi=pmi2", "-n", "2", "--kill-on-bad-exit=1", "-J", "pmi2", "python", "-c",
                 "import os, sys, runpy; from axgrid.launch.env import detect_launch; "
                 "print('PMI', os.environ.get('PMI_RANK'), os.environ.get('PMI_SIZE'), 'MASTER_ADDR' in os.environ, "
                 "detect_launch(), flush=True); sys.argv = ['axgrid.demo', '--grid', '1x2x1x1', '--steps', '3']; "
                 "runpy.run_module('axgrid.demo', run_name='__main__')"],
    }
    with ThreadPoolExecutor(len(jobs)) as ex:
        futures = {k: ex.submit(srun, slurm, v) for k, v in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def test_srun_finds_every_rank_from_slurm_variables(launches, slurm):
    res = launches["detect"]
    assert res.returncode == 0, res.stderr
    found = sorted(re.findall(r"LaunchEnv\(rank=(\d), world_size=4, local_rank=(\d), local_world_size=4, "
                              r"master_addr='([^']*)', master_port=(\d+), launcher='slurm'[,)]", res.stdout))
    assert [(r, l) for r, l, _, _ in found] == [(str(i), str(i)) for i in range(4)], res.stdout
    assert {a for _, _, a, _ in found} == {slurm.node}       # the first host of SLURM_JOB_NODELIST
    assert len({p for _, _, _, p in found}) == 1             # one port, derived from the job id alike


def test_srun_demo_on_4_ranks_matches_serial(launches, slurm):
    res = launches["demo"]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "grid 2x2x1x1" in res.stdout and "4 ranks on 1 node(s), backend gloo" in res.stdout
    assert ": MATCH" in res.stdout, res.stdout
    assert [(c.state, c.exit_code) for c in slurm.completion(name="demo")] == [("COMPLETED", "0:0")]


def test_srun_with_the_pmi2_plugin_and_no_master_addr_matches_serial(launches, slurm):
    """``srun --mpi=pmi2`` sets PMI_RANK/PMI_SIZE beside SLURM_* (as Cray's cray_shasta does on HPE systems), and the
    job exports no MASTER_ADDR: the ranks meet on the step's first node from Slurm's variables, without MPI. (2 ranks:
    what differs from the plain srun launches above is where a rank reads its place; 4 ranks are theirs.)"""
    res = launches["pmi2"]
    assert res.returncode == 0, res.stdout + res.stderr
    seen = sorted(re.findall(r"PMI (\d) 2 False LaunchEnv\(rank=(\d), world_size=2, .*launcher='slurm'", res.stdout))
    assert seen == [(str(i), str(i)) for i in range(2)], res.stdout
    assert "grid 1x2x1x1" in res.stdout and ": MATCH" in res.stdout, res.stdout
    assert [(c.state, c.exit_code) for c in slurm.completion(name="pmi2")] == [("COMPLETED", "0:0")]


def test_srun_train_gpt_on_4_ranks(launches, slurm):
    res = launches["train"]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "on grid 2x1x1x2 (4 ranks, gloo, fp32)" in res.stdout, res.stdout
    assert re.search(r"train_gpt: loss [\d.]+ -> [\d.]+ in 3 steps", res.stdout), res.stdout
    assert [(c.state, c.exit_code) for c in slurm.completion(name="train")] == [("COMPLETED", "0:0")]


# ---- the reliability table under srun -----------------------------------------------------------------------------
HANG_TIMEOUT_S = 5.0
STILL_HUNG_S = 15.0        # without --kill-on-bad-exit a hung rank keeps the step: scancel it this long after
TEARDOWN_BOUND_S = 15.0    # as tests/test_faults.py (goal: 5 s)
CLEANUP_S = 15.0           # after the job's end: its slurmstepd gone, the job out of the queue
# (launcher, case) -> the outcomes allowed: srun's exit code, the job's state and exit code as Slurm recorded them,
# a pattern of srun's task line. With --kill-on-bad-exit, when rank 1 raises or is SIGKILLed, rank 0 sees the
# connection close and leaves by itself with exit 1 while srun is ending the step: whichever comes first decides
# what srun and Slurm report (CI saw rank 0 first: "tasks 0-1: Exited with exit code 1", srun exit 1). Both are
# the job ending as it should; the bound on the teardown and "nothing left" below hold for either.
RAISED = (1, "FAILED", "1:0", r"tasks? (0-)?1: Exited with exit code 1")
KILLED = (137, "FAILED", "0:9", r"task 1: Killed")
EXPECTED = {
    ("srun-kill", "raise"): [(143, "FAILED", "0:15", r"task 1: Exited with exit code 1"), RAISED],
    ("srun-kill", "refuse"): [(143, "FAILED", "0:15", r"task 1: Exited with exit code 1"), RAISED],
    ("srun-kill", "kill"): [(143, "FAILED", "0:15", r"task 1: Killed"), KILLED],
    ("srun-kill", "hang"): [(143, "FAILED", "0:15", r"task 0: Exited with exit code 1")],
    ("srun-kill", "scancel"): [(143, "CANCELLED", "0:0", r"CANCELLED AT")],
    ("srun", "raise"): [RAISED],
    ("srun", "kill"): [KILLED],
    ("srun", "hang"): [(143, "CANCELLED", "0:0", r"task 0: Exited with exit code 1")],
    ("srun", "scancel"): [(143, "CANCELLED", "0:0", r"CANCELLED AT")],
}


def fault_job(slurm, launcher: str, case: str, tmp: Path):
    """One case of the table on the cluster: (Job, its completion record, slurmstepd pids still alive)."""
    tag = f"axgrid-fault-{launcher}-{case}-{tmp.name}"
    still_hung = (launcher, case) == ("srun", "hang")
    mode, kw = srun_case(slurm, launcher, case, rescue_after_s=STILL_HUNG_S if still_hung else RUN_LIMIT_S)
    job = run_job(launcher, mode, tmp, tag=tag, timeout_s=HANG_TIMEOUT_S if case == "hang" else 60.0, **kw)
    rec = slurm.wait_done_named(tag, timeout_s=30.0)
    # Slurm finishes the job's records first, then slurmstepd leaves and the job leaves COMPLETING
    deadline = time.monotonic() + CLEANUP_S
    while time.monotonic() < deadline and (slurm.steps_alive(rec.job_id) or any(tag in q for q in slurm.queue())):
        time.sleep(0.2)
    return job, rec, slurm.steps_alive(rec.job_id), [q for q in slurm.queue() if tag in q]


@pytest.fixture(scope="module")
def fault_jobs(slurm, tmp_path_factory):
    with ThreadPoolExecutor(len(EXPECTED)) as ex:
        futures = {k: ex.submit(fault_job, slurm, *k, tmp_path_factory.mktemp(f"{k[0]}-{k[1]}")) for k in EXPECTED}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.parametrize("launcher,case", list(EXPECTED), ids=[f"{a}-{b}" for a, b in EXPECTED])
def test_srun_fault_ends_the_job_and_leaves_nothing(fault_jobs, launcher, case):
    job, rec, steps, queued = fault_jobs[launcher, case]
    seen = (job.code, rec.state, rec.exit_code)
    allowed = [o for o in EXPECTED[launcher, case] if o[:3] == seen]
    assert allowed, f"srun exit {job.code}, Slurm {rec.state} {rec.exit_code}: not one of " \
                    f"{[o[:3] for o in EXPECTED[launcher, case]]}\n{job.output}"
    assert re.search(allowed[0][3], job.output), job.output
    if case == "raise":
        assert "RuntimeError: rank 1 fails on purpose" in job.output      # the traceback came through srun
    if case == "refuse":        # one of the project's errors on rank 1 only: said once, by rank 1 (axgrid.launch.report)
        said = [line for line in job.output.splitlines() if "shard-00007.bin: bad magic on rank 1" in line]
        assert len(said) == 1 and said[0].startswith("[1] "), job.output
        assert "Traceback" not in job.output and "Connection closed" not in job.output, job.output
    if (launcher, case) == ("srun", "hang"):
        # no --kill-on-bad-exit: rank 0 timed out and left, the hung rank kept the step until scancel
        assert job.rescued and job.teardown_s > STILL_HUNG_S, job.output
    else:
        assert not job.rescued
        bound = TEARDOWN_BOUND_S + (HANG_TIMEOUT_S if case == "hang" else 0.0)
        assert job.teardown_s < bound, job.output
        if case == "hang":
            assert job.teardown_s > HANG_TIMEOUT_S - 1, job.output
    assert not job.left, "processes of the job are still alive:\n" + "\n".join(job.left)
    assert not steps, f"slurmstepd of job {rec.job_id} still alive: {steps}"
    assert not queued, queued


# ---- local.sbatch: signal before the time limit, save, chain, resume on another grid -------------------------------
CHAIN_STEPS = 600          # the schedule's length: more than link 1 trains before its signal arrives (it saves after
                           # every step): on an idle host 150 steps took 5 s, less than the signal's round trip (CI
                           # failed on it). No job trains them all: link 2 and the reference are signalled (below).
WARN_S = 600               # link 1's --signal=USR1@WARN_S; its time limit is cut once it trains (see below)
LINK2_STEPS = 10           # link 2 is signalled once it has trained this many steps (compared with the reference)
REF_PAST = 100             # the reference is signalled once it is this many steps past link 1's save (link 2 stops
                           # within a few steps of LINK2_STEPS) ...
REF_MARGIN = 200           # ... and only while it has more steps than this to go (a signal after its loop, when
                           # the handler is gone, would kill it: 200 steps are 3 s on an idle host)


def test_local_sbatch_saves_on_usr1_and_the_chain_resumes_on_another_grid(slurm, tmp_path):
    """Link 1 (grid 1x2x1x1, CHAIN=1, ``--signal=USR1@600``) gets SIGUSR1 from Slurm while it trains, saves and
    exits 0; its follow-up resumes from latest on grid 2x1x1x1, trains, and saves on SIGUSR1 too (``scancel
    --signal``: the schedule has CHAIN_STEPS steps, more than the signal's round trip lets link 1 train, and
    nothing is learned from training them all); an uninterrupted run of the same script gives the same losses,
    step for step, up to where link 2 stopped.

    A warning that came before train_gpt.py installs its handler would kill the ranks, and Slurm sends warnings
    at its time-limit checks, every 30 s: so once link 1 trains, its time limit is cut (scontrol update) to
    WARN_S from now, which makes the warning due, and the controller is restarted -- it checks time limits as it
    starts -- so the warning goes out at once instead of up to 30 s later. Link 2 is signalled once it has trained
    LINK2_STEPS steps, the reference (if it still trains) once it is REF_PAST steps past link 1's save."""
    script = str(SLURM_DIR / "local.sbatch")
    base = dict(slurm.env, REPO=str(ROOT), MODEL="gpt-tiny", BATCH="4", STEPS=str(CHAIN_STEPS), EXTRA_ARGS=TINY,
                GRID="1x2x1x1")
    chain_env = dict(base, RUN_DIR=str(tmp_path / "chain"), SAVE_EVERY="1", CHAIN="1", NEXT_GRID="2x1x1x1")
    link1 = slurm.sbatch("-t", "15", f"--signal=USR1@{WARN_S}", script, env=chain_env, cwd=tmp_path)
    ref = slurm.sbatch(script, env=dict(base, RUN_DIR=str(tmp_path / "ref"), SAVE_EVERY="0", CHAIN="0"),
                       cwd=tmp_path)
    ref_log = tmp_path / "ref" / f"train-{ref}.jsonl"
    _wait_for(lambda: records(tmp_path / "chain" / f"train-{link1}.jsonl"), RUN_LIMIT_S, "step of link 1")
    started = slurm.command(["squeue", "-h", "-j", str(link1), "-o", "%S"]).stdout.strip()
    elapsed = time.time() - time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S"))
    minutes = int((elapsed + WARN_S) // 60)  # the limit minus WARN_S is now or just past: the warning is due
    slurm.command(["scontrol", "update", f"JobId={link1}", f"TimeLimit={minutes}"])
    slurm.restart_controller()
    rec1 = slurm.wait_done(link1, timeout_s=RUN_LIMIT_S)
    out1 = (tmp_path / f"axgrid-local-{link1}.out").read_text()
    saved = re.search(r"SIGUSR1 received; saved step (\d+)", out1)
    assert saved, out1
    k = int(saved.group(1))
    _wait_for(lambda: len(records(ref_log)) >= k + REF_PAST or slurm.completion(ref), RUN_LIMIT_S,
              f"step {k + REF_PAST} of the reference")
    if not slurm.completion(ref) and len(records(ref_log)) < CHAIN_STEPS - REF_MARGIN:
        slurm.command(["scancel", "--signal=USR1", str(ref)], check=False)     # no error if it finished meanwhile
    link2 = int(re.search(r"Submitted batch job (\d+)", out1).group(1))
    _wait_for(lambda: len(records(tmp_path / "chain" / f"train-{link2}.jsonl")) >= LINK2_STEPS, RUN_LIMIT_S,
              f"step {LINK2_STEPS} of link 2")
    slurm.command(["scancel", "--signal=USR1", str(link2)])
    rec2 = slurm.wait_done(link2, timeout_s=RUN_LIMIT_S)
    out2 = (tmp_path / f"axgrid-local-{link2}.out").read_text()
    saved2 = re.search(r"SIGUSR1 received; saved step (\d+)", out2)
    assert saved2, out2
    k2 = int(saved2.group(1))
    rec_ref = slurm.wait_done(ref, timeout_s=RUN_LIMIT_S)

    assert 0 < k < k + LINK2_STEPS <= k2 < CHAIN_STEPS, (out1, out2)
    assert (rec1.state, rec1.exit_code) == ("COMPLETED", "0:0"), out1      # saved and left before the limit
    assert f"resumed from {tmp_path / 'chain' / 'ckpt'}" in out2 and f"at step {k} (saved on grid 1x2x1x1, " \
        "resharded to 2x1x1x1)" in out2, out2
    assert (rec2.state, rec2.exit_code) == ("COMPLETED", "0:0"), out2
    assert (rec_ref.state, rec_ref.exit_code) == ("COMPLETED", "0:0")
    ref_loss = [r["loss"] for r in records(ref_log)]
    one = records(tmp_path / "chain" / f"train-{link1}.jsonl")
    two = records(tmp_path / "chain" / f"train-{link2}.jsonl")
    assert [r["step"] for r in one + two] == list(range(k2))
    assert len(ref_loss) >= k2
    assert [r["loss"] for r in one] == ref_loss[:k]                         # the same grid: the same numbers
    assert [r["loss"] for r in two] == pytest.approx(ref_loss[k:k2], rel=1e-5)   # resharded: up to rounding


def _wait_for(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError(f"no {what} after {timeout_s} s")


# ---- perfmodel rank --emit-slurm ---------------------------------------------------------------------------------
def test_emitted_sbatch_script_for_the_local_profile_runs_as_written(slurm, tmp_path):
    out = tmp_path / "emit"
    res = subprocess.run(["python", "-m", "axgrid.perfmodel", "rank", "--model", "gpt-tiny", "--gpus", "2",
                          "--machine", "local-4", "--batch", "4", "--dtype", "fp32", "--top", "1", "--layouts", "4d",
                          "--emit-slurm", str(out)], env=slurm.env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    (script,) = sorted(out.glob("*.sbatch"))
    assert script.name.startswith("row01_")
    job = slurm.sbatch("--chdir", str(ROOT), "--output", str(tmp_path / "%j.out"), str(script),
                       env={**slurm.env, "RUN_DIR": str(tmp_path / "run")})
    rec = slurm.wait_done(job, timeout_s=RUN_LIMIT_S)
    text = (tmp_path / f"{job}.out").read_text()
    assert (rec.state, rec.exit_code) == ("COMPLETED", "0:0"), text
    grid = script.stem.split("_", 1)[1]
    assert f"on grid {grid} (2 ranks" in text and re.search(r"loss [\d.]+ -> [\d.]+ in 20 steps", text), text
    assert re.search(r"^step 10/20: loss [\d.]+, \d+ tokens/s, [\d.]+ s/step, 0:\d\d:\d\d left$", text, re.M), text
    assert (tmp_path / "run" / "ckpt" / "latest").exists()         # saved at the end, for a resume


def test_emitted_script_of_a_hugging_face_config_runs_pretrain_here(slurm, tmp_path):
    """rank --config (a tiny Llama) --emit-slurm for local-4: the script runs experiments/train/pretrain.py on the
    config, here as written, to the end (20 steps logged, a checkpoint for a resume)."""
    from axgrid.spec import TransformerShape
    config = tmp_path / "tiny-llama" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TransformerShape("tiny-llama", 1, 32, 2, 16, 64, bias=False, ffn=64,
                                                  family="llama", kv_heads=1).hf_config()))
    out = tmp_path / "emit"
    res = subprocess.run(["python", "-m", "axgrid.perfmodel", "rank", "--config", str(config), "--seq", "16",
                          "--gpus", "2", "--machine", "local-4", "--batch", "4", "--dtype", "fp32", "--top", "1",
                          "--layouts", "4d", "--emit-slurm", str(out)], env=slurm.env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    (script,) = sorted(out.glob("*.sbatch"))
    assert f'CONFIG="${{CONFIG:-{config}}}"' in script.read_text()
    job = slurm.sbatch("--chdir", str(ROOT), "--output", str(tmp_path / "%j.out"), str(script),
                       env={**slurm.env, "RUN_DIR": str(tmp_path / "run")})
    rec = slurm.wait_done(job, timeout_s=RUN_LIMIT_S)
    text = (tmp_path / f"{job}.out").read_text()
    assert (rec.state, rec.exit_code) == ("COMPLETED", "0:0"), text
    assert [r["step"] for r in records(tmp_path / "run" / f"train-{job}.jsonl")] == list(range(20)), text
    assert (tmp_path / "run" / "ckpt" / "latest").exists()


@pytest.mark.parametrize("site,model", list(EMITTED), ids=[f"{a}-{b}" for a, b in EMITTED])
def test_emitted_site_scripts_pass_sbatch_test_only(slurm, tmp_path, site, model):
    """rank --emit-slurm for a GPU machine: scripts numbered by their row in the printed table, built on the site's
    template or gpu.sbatch (its options, --signal, site settings; no account or constraint: given at submission),
    accepted by sbatch --test-only here with what this one node cannot satisfy overridden."""
    res = subprocess.run(["python", "-m", "axgrid.perfmodel", "rank", "--model", model, "--gpus", "64",
                          "--machine", site, "--batch", "64", "--top", "3", "--layouts", "4d",
                          "--emit-slurm", str(tmp_path)], env=slurm.env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    scripts = sorted(tmp_path.glob("row*.sbatch"))
    assert [s.name[:5] for s in scripts] == ["row01", "row02", "row03"]
    template = sbatch_options(SLURM_DIR / f"{EMITTED[site, model]}.sbatch")
    for script in scripts:
        opts = sbatch_options(script)
        assert opts["--signal"] == template["--signal"] and opts["--gpus-per-node"] == opts["--ntasks-per-node"]
        assert "-A" not in opts and "-C" not in opts and int(opts["-N"]) * int(opts["--ntasks-per-node"]) == 64
        text = script.read_text()
        assert f'GRID="${{GRID:-{script.stem.split("_", 1)[1]}}}"' in text and "SBATCH_ACCOUNT=<account>" in text
        assert f"\nMACHINE={site}\n" in text and ("CONFIG=" in text) == model.startswith("llama")
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        res = slurm.command(["sbatch", "--test-only", *OVERRIDES, str(script)], check=False, cwd=ROOT)
        assert res.returncode == 0 and "to start at" in res.stderr, f"{script.name}: {res.stderr}"


# ---- the site templates -------------------------------------------------------------------------------------------
#: options every site template must set in its #SBATCH header
REQUIRED = ("-J", "-A", "-N", "--ntasks-per-node", "--gpus-per-node", "-t", "--signal", "-o")
#: overridden for --test-only (this node has no GPUs, one node, one partition, no features); parsed instead
OVERRIDES = ("-N", "1", "--gpus-per-node=0", "-p", "debug", "--constraint=")


def sbatch_options(path: Path) -> dict[str, str]:
    """The #SBATCH options of a script: {"-N": "16", "--signal": "USR1@120", ...} (comments dropped)."""
    opts = {}
    for line in path.read_text().splitlines():
        if line.startswith("#SBATCH "):
            words = line[len("#SBATCH "):].split("#")[0].split()
            name, _, value = words[0].partition("=")
            opts[name] = value or (words[1] if len(words) > 1 else "")
    return opts


@pytest.mark.parametrize("site", GPU_TEMPLATES)
def test_site_template_is_accepted_by_sbatch_test_only(slurm, site):
    path = SLURM_DIR / f"{site}.sbatch"
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    opts = sbatch_options(path)
    assert set(REQUIRED) <= set(opts), f"{site}: missing {sorted(set(REQUIRED) - set(opts))}"
    nodes, per_node = int(opts["-N"]), int(opts["--ntasks-per-node"])
    assert nodes >= 1 and int(opts["--gpus-per-node"]) == per_node      # one task per GPU
    assert re.fullmatch(r"USR1@\d+", opts["--signal"]), opts["--signal"]
    res = slurm.command(["sbatch", "--test-only", *OVERRIDES, str(path)], check=False, cwd=ROOT)
    assert res.returncode == 0 and "to start at" in res.stderr, f"{site}: {res.stderr}"
    text = path.read_text()
    assert text.rstrip().endswith('source "$REPO/experiments/slurm/common.sh"'), f"{site}: not built on common.sh"
    # the site's srun options (SRUN_ARGS) parse: srun reads its options before it asks the controller anything
    srun_args = re.search(r"^SRUN_ARGS=\((.*)\)$", text, re.M).group(1).replace('"${SRUN_ENV_ARGS[@]}"', "").split()
    res = slurm.command(["srun", "--test-only", "-n", "1", *srun_args, "true"], check=False, cwd=ROOT)
    assert not re.search(r"unrecognized option|invalid option|requires an argument|Invalid --", res.stderr), \
        f"{site}: srun {' '.join(srun_args)}: {res.stderr}"


def test_common_part_of_the_templates(slurm):
    text = (SLURM_DIR / "common.sh").read_text()
    assert subprocess.run(["bash", "-n", str(SLURM_DIR / "common.sh")], capture_output=True).returncode == 0
    assert "srun --kill-on-bad-exit=1" in text and "--dependency=afterany:" in text and '"$CKPT/latest"' in text
    assert sbatch_options(SLURM_DIR / "local.sbatch")["--signal"].startswith("USR1@")
