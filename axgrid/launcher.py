"""``axgrid launch -n N [--] CMD ...``: start N ranks of CMD on this machine.

With the mpich wheel's ``mpiexec`` installed (``pip install 'axgrid[mpi]'``) the ranks are started by it (they
see ``PMI_RANK``/``PMI_SIZE``/``MPI_LOCALRANKID``, and mpi4py agrees on the rendezvous); otherwise by a plain
process launcher that sets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``). Either way every output line is prefixed with its rank, one thread per rank, and when any
rank exits non-zero the others are ended and that exit code is returned.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Optional, Sequence

from .launch import free_port


def find_mpiexec() -> Optional[str]:
    """The mpiexec next to this Python (the mpich wheel puts it in the venv's bin/), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def _pump(stream: IO[bytes], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(f"{prefix}{line}\n")
            out.flush()
    stream.close()


def _end(procs: Sequence[subprocess.Popen], grace_s: float = 3.0) -> None:
    """SIGTERM every process group still alive, then SIGKILL after ``grace_s``."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def launch(n: int, cmd: Sequence[str], *, use_mpi: Optional[bool] = None, threads_per_rank: int = 1,
           out: IO[str] = sys.stdout, timeout_s: Optional[float] = None) -> int:
    """Run ``cmd`` as ``n`` ranks; return 0 when all succeed, else the first failing rank's exit code.

    ``use_mpi``: None picks mpiexec when it is installed. ``threads_per_rank`` sets OMP_NUM_THREADS unless the
    environment already sets it. ``timeout_s`` ends the whole job (exit code 124) when it runs longer.
    """
    if n < 1:
        raise ValueError(f"-n {n}: the number of ranks must be >= 1")
    if not cmd:
        raise ValueError("no command to launch: axgrid launch -n N [--] CMD ...")
    mpiexec = find_mpiexec() if use_mpi in (None, True) else None
    if use_mpi and not mpiexec:
        raise FileNotFoundError("mpiexec not found: pip install 'axgrid[mpi]' (mpi4py + mpich), or use_mpi=False")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank))
    env["PYTHONUNBUFFERED"] = "1"
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="axgrid-launch-") as tmp:
        if mpiexec:
            wrap = [sys.executable, "-m", "axgrid.launcher", "--wrap", tmp, "--"]
            procs = [subprocess.Popen([mpiexec, "-n", str(n), *wrap, *cmd], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)]
            prefixes = [""]
        else:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(n),
                       LOCAL_WORLD_SIZE=str(n))
            procs = []
            for r in range(n):
                procs.append(subprocess.Popen(list(cmd), env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            prefixes = [f"[{r}] " for r in range(n)]
        pumps = [threading.Thread(target=_pump, args=(p.stdout, pre, out, lock), daemon=True)
                 for p, pre in zip(procs, prefixes)]
        for t in pumps:
            t.start()
        code = 0
        start = time.monotonic()
        try:
            while True:
                codes = [p.poll() for p in procs]
                failed = [c for c in codes if c not in (None, 0)]
                marks = [f for f in os.listdir(tmp) if f.startswith("fail-")]
                if failed or marks:
                    if failed:
                        code = failed[0]
                    else:
                        with open(os.path.join(tmp, marks[0])) as f:
                            text = f.read().strip()
                        code = int(text) if text.isdigit() else 1
                    break
                if all(c == 0 for c in codes):
                    break
                if timeout_s is not None and time.monotonic() - start > timeout_s:
                    with lock:
                        out.write(f"axgrid launch: job exceeded {timeout_s} s, ending all ranks\n")
                    code = 124
                    break
                time.sleep(0.05)
        except KeyboardInterrupt:
            code = 130
        finally:
            _end(procs)
            for t in pumps:
                t.join(timeout=2)
        if code:
            with lock:
                out.write(f"axgrid launch: a rank exited with code {code}; the other ranks were ended\n")
        return code


def _wrap(tmp: str, cmd: Sequence[str]) -> int:
    """Run one rank's command under mpiexec: prefix its output lines with the rank (whole lines, one write
    each), and on failure leave a mark so the launcher ends the job."""
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "x"))
    pass_fds = tuple(int(os.environ[k]) for k in ("PMI_FD",) if os.environ.get(k, "").isdigit())
    proc = subprocess.Popen(list(cmd), pass_fds=pass_fds, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    pump = threading.Thread(target=_pump, args=(proc.stdout, f"[{rank}] ", sys.stdout, threading.Lock()),
                            daemon=True)
    pump.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        code = proc.wait()
    pump.join(timeout=5)
    if code != 0:
        with open(os.path.join(tmp, f"fail-{rank}"), "w") as f:
            f.write(str(code if code > 0 else 128 - code))
    return code


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--wrap" and sys.argv[3] == "--":
        sys.exit(_wrap(sys.argv[2], sys.argv[4:]))
    sys.exit("usage: python -m axgrid.launcher --wrap DIR -- CMD ... (internal; use `axgrid launch`)")
