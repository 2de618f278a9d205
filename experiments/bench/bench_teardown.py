"""Teardown time of a failing 2-rank job, per failure and launcher: the figures in docs/results.md ("Reliability").

    python experiments/bench/bench_teardown.py                         # every launcher, every case, once
    python experiments/bench/bench_teardown.py --launchers plain,torchrun --cases raise,kill --repeat 3
    python experiments/bench/bench_teardown.py --launchers srun-kill,srun --cases raise,kill,hang,scancel   # Slurm

Each job is axgrid/testing/fault_rank.py (2 ranks all-reducing in a loop; see axgrid/testing/faults.py). Cases: ``raise`` (rank 1
raises), ``exit`` (rank 1 calls sys.exit(7)), ``kill`` (rank 1 SIGKILLs itself), ``hang`` (rank 1 sleeps; the
collective timeout is --hang-timeout), ``sigterm`` (SIGTERM to the launcher once both ranks are up), ``scancel``
(srun only: the job is cancelled once both ranks are up). ``srun`` / ``srun-kill`` (without / with
``--kill-on-bad-exit=1``) run on a private one-node Slurm started for the run (axgrid/testing/slurm.py); a job still
running --rescue-after s after its fault (a hung rank that srun waits for) is cancelled and marked. Printed per
job: the launcher's exit code, seconds from the fault to the launcher's exit, and how many of the job's
processes / temporary folders were left behind.
"""
from __future__ import annotations

import argparse
import os
import signal
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from axgrid.testing.faults import MPIEXEC, JobHung, run_job, srun_case

CASES = ("raise", "exit", "kill", "hang", "sigterm", "scancel")
SRUN = ("srun", "srun-kill")


def main(argv: list[str] | None = None) -> None:
    launchers = ["mpiexec", "plain", "bare-mpiexec", "torchrun"] if MPIEXEC else ["plain", "torchrun"]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launchers", default=",".join(launchers))
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--hang-timeout", type=float, default=5.0, help="collective timeout (s) of the hang jobs")
    p.add_argument("--rescue-after", type=float, default=10.0, help="srun: cancel a job still running this long "
                   "after its fault")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        cluster = None
        if any(name in SRUN for name in args.launchers.split(",")):
            from axgrid.testing.slurm import SlurmCluster
            cluster = SlurmCluster(Path(root)).start()
        try:
            _run(args, cluster)
        finally:
            if cluster is not None:
                cluster.stop()


def _run(args: argparse.Namespace, cluster) -> None:
    print(f"{'launcher':<13} {'case':<8} {'exit':>5} {'teardown s':>11} {'left procs':>10} {'left dirs':>9}")
    for launcher in args.launchers.split(","):
        for case in args.cases.split(","):
            if case == "sigterm" and launcher == "bare-mpiexec":
                continue   # mpiexec's own signal handling, not axgrid's
            if (case == "scancel" and launcher not in SRUN) or (case == "sigterm" and launcher in SRUN):
                continue   # scancel: srun's; SIGTERM to the launcher: the others'
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as tmp:
                    kw = dict(send=signal.SIGTERM) if case == "sigterm" else {}
                    mode = {"sigterm": "run"}.get(case, case)
                    if launcher in SRUN:
                        mode, kw = srun_case(cluster, launcher, case, args.rescue_after)
                    timeout = args.hang_timeout if case == "hang" else 60.0
                    try:
                        job = run_job(launcher, mode, Path(tmp), timeout_s=timeout, **kw)
                    except JobHung:
                        print(f"{launcher:<13} {case:<8} {'-':>5} {'> 300 (hung)':>11}", flush=True)
                        continue
                    rescued = f" (still running after {args.rescue_after:g} s: scancel)" if job.rescued else ""
                    print(f"{launcher:<13} {case:<8} {job.code:>5} {job.teardown_s:>11.2f} {len(job.left):>10} "
                          f"{len(job.folders):>9}{rescued}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from axgrid.launch.errors import run
    run(main, "bench_teardown")     # errors said once, as one line (axgrid.launch.errors)
