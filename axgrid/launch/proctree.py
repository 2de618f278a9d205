"""Find, signal and end the processes of one launched job, however deep they are (Linux /proc).

Every process a launcher starts inherits the environment variable ``AXGRID_LAUNCH_JOB=<job id>`` (mpiexec, its
Hydra proxies, the per-rank wrappers, the ranks and whatever they start): :func:`job_pids` finds them by it,
even after their parent died or when they run in sessions of their own.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Iterable

from .env import LAUNCH_JOB_VAR as JOB_VAR   # tags every process of a launched job


def _state(pid: int) -> str | None:
    """The state letter of ``pid`` ("R", "S", "Z", ...), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split(maxsplit=1)[0]   # the name may contain spaces and parentheses


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    return _state(pid) not in (None, "Z", "X")


def job_pids(job: str) -> list[int]:
    """Pids of the live processes whose environment carries ``AXGRID_LAUNCH_JOB=job``."""
    tag = f"{JOB_VAR}={job}".encode()
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if tag in env.split(b"\0") and alive(int(name)):
            found.append(int(name))
    return found


def signal_groups(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to the process group each pid leads (a rank and what it started), or to the pid itself
    when it leads none; processes already gone are skipped."""
    for pid in pids:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: Iterable[int], deadline: float) -> bool:
    """Wait until none of ``pids`` is alive (True) or ``time.monotonic()`` passes ``deadline`` (False)."""
    pids = list(pids)
    while any(alive(p) for p in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def kill_job(job: str) -> None:
    """SIGKILL every process of ``job`` until none is left (a dying parent may just have forked)."""
    for _ in range(5):
        pids = job_pids(job)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        wait_gone(pids, time.monotonic() + 2.0)
