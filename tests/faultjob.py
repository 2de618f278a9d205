"""Run one fault-injection job (tests/fault_rank.py on 2 ranks) under a launcher and time its teardown.

Used by tests/test_faults.py and experiments/bench_teardown.py. Launchers: ``mpiexec`` (``axgrid launch``, the
default), ``plain`` (``axgrid launch --no-mpi``), ``bare-mpiexec`` (mpiexec without axgrid's launcher) and
``torchrun``. The job's processes are found by a tag on their command lines (/proc), its temporary folder by
TMPDIR. Teardown runs from the fault (the failing rank's ``FAIL`` line, or the signal sent to the launcher) to the
launcher's exit.
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
from typing import Optional

from axgrid.launcher import find_mpiexec

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "fault_rank.py")
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


def command(launcher: str, rank_cmd: list[str]) -> list[str]:
    if launcher == "bare-mpiexec":
        return [MPIEXEC, "-n", "2", *rank_cmd]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *rank_cmd[1:]]
    plain = ["--no-mpi"] if launcher == "plain" else []
    return [sys.executable, "-m", "axgrid.cli", "launch", "-n", "2", *plain, "--", *rank_cmd]


def run_job(launcher: str, mode: str, tmpdir: Path, timeout_s: float = 60.0, send: Optional[int] = None) -> Job:
    """Run fault_rank.py MODE on 2 ranks (rank 1 misbehaves) under ``launcher``; with ``send``, send that signal
    to the launcher once both ranks are up."""
    tag = f"axgrid-fault-{uuid.uuid4().hex}"
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    proc = subprocess.Popen(command(launcher, [sys.executable, SCRIPT, mode, "1", str(timeout_s), tag]), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(lambda: proc.stdout.readline().decode(), "")))
    reader.start()
    fault_at = None
    deadline = time.monotonic() + JOB_LIMIT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if send is not None and fault_at is None and sum("READY" in s for s in list(lines)) == 2:
                fault_at = time.time()
                proc.send_signal(send)
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
        fails = [s.split("FAIL ")[1] for s in output.splitlines() if "FAIL " in s]
        if not fails:
            raise RuntimeError(f"{launcher} {mode}: no rank reported its fault:\n{output}")
        fault_at = float(fails[0].split()[0])
    return Job(proc.returncode, output, end - fault_at, left, sorted(p.name for p in tmpdir.glob("axgrid-launch-*")))
