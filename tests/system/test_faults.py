"""Failures end the whole job, fast, with the failing rank's exit code, and leave nothing behind.

Real jobs of axgrid/testing/fault_rank.py (2 ranks, see axgrid/testing/faults.py) under ``axgrid launch`` (mpiexec, the
default), ``axgrid launch --no-mpi`` (the plain launcher) and a bare ``mpiexec``: one rank raises, hangs or is
SIGKILLed, or the launcher gets SIGTERM/SIGHUP. Afterwards no process of the job may be alive and no
axgrid-launch-* folder left. The time bounds are generous for a loaded 2-core machine (the goal is 5 s).
Every job of the module starts at once (the ``jobs`` fixture; a rank's start-up and a collective timeout of one
job overlap the others'); each test checks its own job.

Who is stuck where (axgrid.launch.flight): when a rank hangs or skips a collective, every rank prints its last
collectives and writes them to the run's directory, and ``axgrid launch`` says which ranks stopped at which collective.
"""
from __future__ import annotations

import json
import os
import signal
from functools import partial
from pathlib import Path

import pytest
import torch

from axgrid.launch.flight import main as flight_main
from axgrid.testing.faults import JOB_LIMIT_S, MPIEXEC, Job, JobHung, run_job
from helpers.side_by_side import outcome, side_by_side

LAUNCHERS = ["plain"] + (["mpiexec"] if MPIEXEC else [])
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec is not installed (pip install 'axgrid[mpi]')")

RAISE_BOUND_S = 15.0     # a raising or killed rank: all ranks gone within this (goal: 5 s)
HANG_TIMEOUT_S = 5.0     # the collective timeout of the hang jobs
HANG_SLACK_S = 20.0      # ... which must end within HANG_TIMEOUT_S + this
SIGNALS = [("plain", signal.SIGHUP)] + ([("mpiexec", signal.SIGTERM)] if MPIEXEC else [])
WAIT_S = 2 * JOB_LIMIT_S + 60   # a test's wait for its job (two in a row for the flight recorder), each bounded


def skip_then_hang(launcher: str, tmp: Path) -> tuple[Job, Job, Path]:
    """The flight recorder's pair, one after the other into one run directory: a job where rank 1 skips a
    collective, then a rerun where rank 1 hangs. Returns both jobs and the run directory."""
    run = tmp / "run"
    job = run_job(launcher, "skip", tmp, timeout_s=HANG_TIMEOUT_S, launch_args=("--run-dir", str(run)))
    again = run_job(launcher, "hang", tmp, timeout_s=HANG_TIMEOUT_S, launch_args=("--run-dir", str(run)))
    return job, again, run


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every job of this module, started at once, the longest first (each in a folder of its own, its TMPDIR):
    futures by (case, launcher)."""
    def folder(*key) -> Path:
        return tmp_path_factory.mktemp("-".join(str(k) for k in key))

    calls = {("skip-then-hang", LAUNCHERS[0]): partial(skip_then_hang, LAUNCHERS[0], folder("flight", LAUNCHERS[0]))}
    for launcher in LAUNCHERS:
        calls["hang", launcher] = partial(run_job, launcher, "hang", folder("hang", launcher), timeout_s=HANG_TIMEOUT_S)
    if MPIEXEC:
        calls["hang", "bare-mpiexec"] = partial(run_job, "bare-mpiexec", "hang", folder("hang-bare"),
                                                timeout_s=HANG_TIMEOUT_S)
    for launcher in LAUNCHERS:
        for case in ("raise", "kill"):
            calls[case, launcher] = partial(run_job, launcher, case, folder(case, launcher))
    for launcher, sig in SIGNALS:
        calls[sig, launcher] = partial(run_job, launcher, "run", folder("signal", launcher), send=sig)
    with side_by_side(calls) as started:
        yield started


def job_of(jobs, *key):
    """The result of this module's job ``key`` (see ``jobs``); a job still running after JOB_LIMIT_S fails the test."""
    try:
        return outcome(jobs[key], timeout_s=WAIT_S)
    except JobHung as e:
        pytest.fail(str(e))


def check_clean(job: Job) -> None:
    assert not job.left, f"processes of the job are still alive:\n" + "\n".join(job.left)
    assert not job.folders, f"temporary folders left behind: {job.folders}"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_raising_rank_ends_the_job_with_its_exit_code(jobs, launcher):
    job = job_of(jobs, "raise", launcher)
    assert job.code == 1, job.output
    assert "rank 1 exited with code 1; the other ranks were ended" in job.output
    assert "RuntimeError: rank 1 fails on purpose" in job.output     # its traceback was printed before it left
    # ... once, and nothing of the other rank's teardown: its "Connection closed" traceback and flight records
    # are consequences (axgrid.launch.report); before, they followed the cause, 89 lines of them on 4 ranks
    assert job.output.count("Traceback") == 1, job.output
    others = [line for line in job.output.splitlines() if line.startswith("[0] ") and "READY" not in line]
    assert not others and "flight recorder" not in job.output, job.output
    assert job.teardown_s < RAISE_BOUND_S, job.output
    check_clean(job)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_killed_rank_ends_the_job_with_137(jobs, launcher):
    job = job_of(jobs, "kill", launcher)
    assert job.code == 137, job.output
    assert "rank 1 exited with code 137" in job.output
    assert job.teardown_s < RAISE_BOUND_S, job.output
    check_clean(job)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_hung_rank_ends_the_job_after_the_collective_timeout(jobs, launcher):
    job = job_of(jobs, "hang", launcher)
    # rank 0 times out in its all-reduce with the sleeping rank 1: its failure ends the job
    assert job.code == 1, job.output
    assert "rank 0 exited with code 1" in job.output
    assert HANG_TIMEOUT_S - 1 < job.teardown_s < HANG_TIMEOUT_S + HANG_SLACK_S, job.output
    check_clean(job)
    # who is stuck where: rank 0 in all-reduce #4, rank 1 (asked by the launcher) never posted it
    assert "axgrid launch:   rank 0: stopped in collective #4: all_reduce over d (its #4), 16 B, failed" in job.output
    assert "axgrid launch:   rank 1: completed collective #3 (all_reduce over d, its #3, 16 B) and posted " \
           "nothing after it" in job.output, job.output
    assert "axgrid flight recorder, rank 1" in job.output and "asked for it (another rank stopped)" in job.output


@pytest.mark.parametrize("launcher", LAUNCHERS[:1])
def test_the_flight_recorder_says_which_rank_skipped_a_collective_and_a_rerun_says_its_own(jobs, launcher, capsys):
    """Rank 1 skips one all-reduce, so it posts the next collective (an all-gather) while rank 0 posts the
    all-reduce: both wait until the collective timeout. Each rank prints its last collectives and writes them to
    the job's folder of the run's directory; the launcher says both stopped at collective #7, with different
    operations. Then a rerun into the same run directory, where rank 1 hangs instead: the first job's stop file and
    dumps are its own, so the rerun is diagnosed for what it did (before, every rank dumped at start on the old stop
    file, which switched the hang watchdog off, and the summary could report the old job's dumps)."""
    job, again, run = job_of(jobs, "skip-then-hang", launcher)
    assert job.code == 1, job.output
    assert "rank 0: stopped in collective #7: all_reduce over d (its #7), 16 B, failed" in job.output, job.output
    assert "rank 1: stopped in collective #7: all_gather over d (its #7), 64 B, failed" in job.output, job.output
    assert again.code == 1 and "rank 0 exited with code 1" in again.output, again.output
    assert "rank 0: stopped in collective #4: all_reduce over d (its #4), 16 B, failed" in again.output, again.output
    assert "rank 1: completed collective #3 (all_reduce over d, its #3, 16 B) and posted nothing after it" \
        in again.output, again.output
    assert "posted no collective" not in again.output and "collective #7" not in again.output, again.output
    # rank 0 fails first, so nobody asks it for a dump: an earlier job's stop file did (at start, with the hang
    # watchdog then off for the whole run)
    assert not [line for line in again.output.splitlines()
                if line.startswith("[0] axgrid flight recorder") and "asked for it" in line], again.output
    first, second = sorted((run / "flight").iterdir())   # a folder per job, the first job's kept
    for r in (0, 1):
        assert f"axgrid flight recorder, rank {r}" in job.output
        doc = json.loads((first / f"rank-{r:05d}.json").read_text())
        assert doc["rank"] == r and doc["reason"].startswith("a collective failed")
        last = doc["records"][-1]
        assert (last["seq"], last["dim"], last["op"], last["state"]) == \
            (7, "d", "all_reduce" if r == 0 else "all_gather", "failed")
        assert [x["op"] for x in doc["records"][:6]] == ["all_reduce", "all_gather"] * 3
    assert [x["op"] for x in json.loads((second / "rank-00001.json").read_text())["records"]] == ["all_reduce"] * 3
    assert flight_main([str(run)]) == 0                  # python -m axgrid.launch.flight RUN_DIR: the latest job
    said = capsys.readouterr().out
    assert said.startswith(f"job {second.name} (") and "rank 0: stopped in collective #4" in said, said
    check_clean(job)
    check_clean(again)


@pytest.mark.parametrize("launcher,sig", SIGNALS)
def test_a_signal_to_the_launcher_is_forwarded_and_the_job_cleaned_up(jobs, launcher, sig):
    job = job_of(jobs, sig, launcher)
    assert job.code == 128 + sig, job.output
    assert f"got {signal.Signals(sig).name}; forwarded it to the ranks" in job.output
    assert job.teardown_s < RAISE_BOUND_S, job.output
    check_clean(job)


@needs_mpiexec
def test_a_hung_rank_ends_a_bare_mpiexec_job(jobs):
    """Without axgrid launch: the rank that times out leaves without MPI_Finalize, so Hydra ends the hung one."""
    job = job_of(jobs, "hang", "bare-mpiexec")
    assert job.code == 1, job.output
    assert HANG_TIMEOUT_S - 1 < job.teardown_s < HANG_TIMEOUT_S + HANG_SLACK_S, job.output
    check_clean(job)


def _gloo_threads() -> int:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sum(n.startswith(("pt_gloo", "gloo")) for n in names)


def _threads_after_destroy() -> tuple[int, int, int]:
    import axgrid
    before = _gloo_threads()
    grid = axgrid.init("2x1x1", timeout_s=30)
    grid.comm.all_reduce(torch.ones(3), "x")
    during = _gloo_threads()
    grid.destroy()
    return before, during, _gloo_threads()


def test_destroy_joins_the_gloo_threads_of_its_groups(ranks):
    """The cause of the exit-134 aborts at teardown: groups outlived destroy() and died during interpreter
    shutdown. Now their threads are joined by destroy() itself."""
    for before, during, after in ranks(2, _threads_after_destroy):
        assert during > before
        assert after == before
