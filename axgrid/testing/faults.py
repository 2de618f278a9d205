"""Run one fault-injection job (:mod:`axgrid.testing.fault_rank`, on 2 ranks unless told) under a launcher and time its
teardown.

Used by the fault and Slurm tests and experiments/bench/bench_teardown.py. Launchers: ``mpiexec``
(``axgrid launch``, the default), ``plain`` (``axgrid launch --no-mpi``), ``bare-mpiexec`` (mpiexec without axgrid's
launcher), ``torchrun``, and ``srun`` / ``srun-kill`` (``srun -n 2``, without / with ``--kill-on-bad-exit=1``; the
job is named by the tag, and ``env`` must point at a cluster: axgrid/testing/slurm.py). The job's processes are found
by a tag on their command lines (/proc), its temporary folder by TMPDIR. Teardown runs from the fault (the failing
rank's ``FAIL`` line, or the signal sent to the launcher) to the launcher's exit.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from axgrid.launch.local import find_mpiexec

#: The folder that holds the axgrid package (a checkout's root): on the ranks' PYTHONPATH.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
RANK_CMD = [sys.executable, "-m", "axgrid.testing.fault_rank"]
MPIEXEC = find_mpiexec()
JOB_LIMIT_S = 300.0      # a job still running after this is a hang (start-up on a loaded box is slow)


class JobHung(RuntimeError):
    """The job was still running after JOB_LIMIT_S."""


@dataclass
class Job:
    code: int
    output: str
    teardown_s: float    # from the fault (FAIL line or signal) to the launcher's exit
    left: list[str]      # "pid: command line" of the job's processes still alive afterwards
    folders: list[str]   # axgrid-launch-* folders left in the job's TMPDIR
    rescued: bool = False  # still running ``rescue_after_s`` after the fault: ``rescue`` was called


def tagged(tag: str) -> list[str]:
    """"pid: command line" of every live process whose command line contains ``tag``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag in cmd:
            found.append(f"{name}: {cmd}")
    return found


def command(launcher: str, rank_cmd: list[str], tag: str = "", launch_args: tuple[str, ...] = (),
            ranks: int = 2) -> list[str]:
    n = str(ranks)
    if launcher in ("srun", "srun-kill"):
        kill = ["--kill-on-bad-exit=1"] if launcher == "srun-kill" else ["--kill-on-bad-exit=0"]
        return ["srun", "-n", n, f"--job-name={tag}", *kill, *rank_cmd]
    if launcher == "bare-mpiexec":
        return [MPIEXEC, "-n", n, *rank_cmd]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n, *rank_cmd[1:]]
    plain = ["--no-mpi"] if launcher == "plain" else []
    return [sys.executable, "-m", "axgrid.cli", "launch", "-n", n, *plain, *launch_args, "--", *rank_cmd]


#: What to do to a job once both ranks are up: a signal for the launcher, or a call (the launcher's process,
#: the job's tag) that does something else, e.g. ``scancel`` it.
Send = Union[int, Callable[[subprocess.Popen, str], None]]


def run_job(launcher: str, mode: str, tmpdir: Path, timeout_s: float = 60.0, send: Optional[Send] = None,
            env: Optional[dict[str, str]] = None, tag: Optional[str] = None, rescue_after_s: Optional[float] = None,
            rescue: Optional[Callable[[subprocess.Popen, str], None]] = None,
            launch_args: tuple[str, ...] = (), ranks: int = 2, bad: int = 1) -> Job:
    """Run fault_rank MODE on ``ranks`` ranks (rank ``bad`` misbehaves) under ``launcher``; with ``send``, send that signal
    to the launcher (or make that call) once both ranks are up. ``env``: the launcher's environment (default:
    this process's). A job still running ``rescue_after_s`` seconds after the fault is ended by ``rescue(proc,
    tag)`` (a hung rank under a launcher that waits for it), and the Job says ``rescued``. ``launch_args``: more
    options for ``axgrid launch`` (e.g. ``--run-dir``)."""
    tag = tag or f"axgrid-fault-{uuid.uuid4().hex}"
    env = dict(os.environ if env is None else env, TMPDIR=str(tmpdir), PYTHONPATH=str(SOURCE_ROOT),
               OMP_NUM_THREADS="1")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "AXGRID_RUN_DIR"):
        env.pop(k, None)
    proc = subprocess.Popen(command(launcher, [*RANK_CMD, mode, str(bad), str(timeout_s), tag], tag, launch_args,
                                    ranks),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(lambda: proc.stdout.readline().decode(), "")))
    reader.start()
    fault_at, rescued = None, False
    deadline = time.monotonic() + JOB_LIMIT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if send is not None and fault_at is None and sum("READY" in s for s in list(lines)) == ranks:
                fault_at = time.time()
                send(proc, tag) if callable(send) else proc.send_signal(send)
            failed = _fault_time(lines)
            if rescue and not rescued and failed and time.time() > failed + rescue_after_s:
                rescued = True
                rescue(proc, tag)
            time.sleep(0.02)
        end = time.time()
        hung = proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        reader.join(timeout=10)
        left = tagged(tag)
        for line in left:   # never leave a job's processes behind, even when the check fails
            try:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    output = "".join(lines)
    if hung:
        raise JobHung(f"{launcher} {mode}: the job was still running after {JOB_LIMIT_S} s:\n{output}")
    if fault_at is None:
        fault_at = _fault_time(lines)
        if fault_at is None:
            raise RuntimeError(f"{launcher} {mode}: no rank reported its fault:\n{output}")
    return Job(proc.returncode, output, end - fault_at, left, sorted(p.name for p in tmpdir.glob("axgrid-launch-*")),
               rescued)


def srun_case(cluster, launcher: str, case: str, rescue_after_s: float) -> tuple[str, dict]:
    """fault_rank's mode and run_job's keywords for ``case`` under ``srun``/``srun-kill`` on ``cluster`` (a
    axgrid.testing.slurm.SlurmCluster): ``scancel`` cancels the job once both ranks are up; a job still running
    ``rescue_after_s`` after its fault (a hung rank srun waits for, without --kill-on-bad-exit) is cancelled."""
    def cancel(proc: subprocess.Popen, tag: str) -> None:
        cluster.command(["scancel", f"--name={tag}"])

    kw: dict = dict(env=cluster.env, rescue_after_s=rescue_after_s, rescue=cancel)
    if case == "scancel":
        kw["send"] = cancel
    return ("run" if case == "scancel" else case), kw


def _fault_time(lines: list[str]) -> Optional[float]:
    """The unix time on the first ``FAIL <time>`` line, or None."""
    fails = [s.split("FAIL ")[1] for s in list(lines) if "FAIL " in s]
    return float(fails[0].split()[0]) if fails else None
