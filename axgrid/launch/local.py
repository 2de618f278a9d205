"""``axgrid launch -n N [--] CMD ...``: start N ranks of CMD on this machine, and end them together.

With the mpich wheel's ``mpiexec`` installed (``pip install 'axgrid[mpi]'``) the ranks are started by it (they see
``PMI_RANK``/``PMI_SIZE``/``MPI_LOCALRANKID``); otherwise by a plain process launcher that sets torchrun's
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
Either way every output line is prefixed with its rank, and one thread runs per rank.

How the job ends, under both:

- every rank exits 0: exit code 0;
- a rank exits non-zero or dies of a signal: the others get SIGTERM, and SIGKILL 2 s later; the exit code is the
  first failing rank's (128 + N for signal N: 137 for SIGKILL);
- ``timeout_s`` passes: the same, exit code 124;
- SIGTERM, SIGHUP or SIGINT reaches the launcher: it is forwarded to every rank, the ranks still alive after
  ``grace_s`` are SIGKILLed, and the exit code is 128 + the signal (143, 129, 130); a second signal kills at once.

A rank that stops on one of the project's own errors records its one-line message in the job's folder
(:mod:`axgrid.launch.errors`); the launcher prints the line of the first rank to fail once (prefixed by the rank)
instead of its "rank R exited" line. A rank whose own code raised first (a bug: it printed its traceback) leaves a
record too, so the launcher does not ask for flight records: the other ranks' failures are its consequences, and they
stay quiet (:mod:`axgrid.launch.report`). :func:`preflight` refuses, before any rank starts, what it can
check from the command line: a missing script, and a ``--grid`` that does not parse or does not have N ranks.

Afterwards no process of the job is left (every one carries ``AXGRID_LAUNCH_JOB`` in its environment; see
:mod:`axgrid.launch.proctree`) and the job's ``/tmp/axgrid-launch-*`` folder is gone.

Who is stuck where: the ranks see the run's directory as ``AXGRID_RUN_DIR`` (``run_dir``, default a folder inside
the job's temporary one). When the job fails with no rank's error to say, the launcher asks every rank for its
flight record (it creates ``stop`` in this job's folder of ``<run_dir>/flight/``; see :mod:`axgrid.launch.flight`),
waits up to ``FLIGHT_WAIT_S`` for the dumps, then ends the ranks and prints which ranks stopped at which collective.
"""
from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Optional, Sequence

from . import errors, flight, proctree
from .env import LAUNCH_DIR_VAR, RUN_DIR_VAR, LaunchError, free_port
from ..spec.layout import GridError, GridShape, WorldSizeMismatch

#: Signals the launcher forwards to the ranks.
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
#: Seconds between SIGTERM and SIGKILL when the launcher ends the ranks after a failure or timeout.
FAILURE_GRACE_S = 2.0
#: Seconds the launcher waits for the ranks' flight records after a failure before it ends them.
FLIGHT_WAIT_S = 3.0


def find_mpiexec() -> Optional[str]:
    """The mpiexec next to this Python (the mpich wheel puts it in the venv's bin/), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def exit_code(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _pump(stream: IO[bytes], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(f"{prefix}{line}\n")
            out.flush()
    stream.close()


class _Signals:
    """Catch the forwarded signals while a job runs (main thread only); remember the first, count them."""

    def __init__(self) -> None:
        self.first: Optional[int] = None
        self.count = 0
        self._previous: dict[int, object] = {}

    def _handler(self, signum: int, frame: object) -> None:
        self.first = self.first or signum
        self.count += 1

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for s in FORWARDED:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)


class _Job:
    """The started processes of one job and what is known about how its ranks exited."""

    def __init__(self, procs: list[subprocess.Popen], prefixes: list[str], tmp: str, mpi: bool) -> None:
        self.procs, self.prefixes, self.tmp, self.mpi = procs, prefixes, tmp, mpi
        self.exits: "queue.Queue[tuple[int, int]]" = queue.Queue()   # (index into procs, exit code), in order
        self.codes: dict[int, int] = {}
        for i, p in enumerate(procs):
            threading.Thread(target=lambda i=i, p=p: self.exits.put((i, exit_code(p.wait()))), daemon=True).start()

    def wait_event(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when a started process exits."""
        try:
            i, code = self.exits.get(timeout=timeout)
            self.codes[i] = code
        except queue.Empty:
            pass
        while not self.exits.empty():
            i, code = self.exits.get_nowait()
            self.codes[i] = code

    def failure(self) -> Optional[tuple[str, int]]:
        """(which rank, exit code) of the first rank that failed, or None."""
        if self.mpi:
            try:
                with open(os.path.join(self.tmp, "failed")) as f:
                    rank, code = f.read().split()
                return rank, int(code)
            except (OSError, ValueError):
                pass
            code = self.codes.get(0, 0)     # mpiexec itself failed (bad arguments, a rank it could not start)
            return ("mpiexec", code) if code else None
        for i, code in self.codes.items():   # in the order the exits were seen
            if code:
                return str(i), code
        return None

    def done(self) -> bool:
        return len(self.codes) == len(self.procs) and not any(self.codes.values())

    def rank_pids(self) -> list[int]:
        """Pids of the ranks' processes (each leads its own process group)."""
        if not self.mpi:
            return [p.pid for p in self.procs]
        pids = []
        for name in os.listdir(self.tmp):
            if name.startswith("rank-") and name.endswith(".pid"):
                with open(os.path.join(self.tmp, name)) as f:
                    pids.append(int(f.read()))
        return pids


def _start(n: int, cmd: Sequence[str], mpiexec: Optional[str], env: dict[str, str], tmp: str) -> _Job:
    popen = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    if mpiexec:
        wrap = [sys.executable, "-m", "axgrid.launch.local", "--wrap", tmp, "--"]
        return _Job([subprocess.Popen([mpiexec, "-n", str(n), *wrap, *cmd], env=env, **popen)], [""], tmp, True)
    procs = [subprocess.Popen(list(cmd), env=dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),
                                                  LOCAL_WORLD_SIZE=str(n)), **popen) for r in range(n)]
    return _Job(procs, [f"[{r}] " for r in range(n)], tmp, False)


def _end(job: _Job, sig: int, grace_s: float, signals: _Signals) -> None:
    """Send ``sig`` to every rank, wait up to ``grace_s`` for them (less when another signal arrives), then
    SIGKILL whatever of the job is left and reap the started processes."""
    ranks = job.rank_pids()
    proctree.signal_groups(ranks, sig)
    seen = signals.count
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and signals.count == seen and any(proctree.alive(p) for p in ranks):
        time.sleep(0.02)
    if job.mpi:     # mpiexec exits once its ranks have: let it pass on their last lines (tracebacks) first
        proctree.signal_groups([p for p in ranks if proctree.alive(p)], signal.SIGKILL)   # ranks, not wrappers:
        proctree.wait_gone([job.procs[0].pid], time.monotonic() + 3.0)   # a wrapper killed draws Hydra's banner
    proctree.kill_job(os.path.basename(job.tmp))
    for p in job.procs:
        p.wait()


def _collect_flight(run_dir: str, n: int, job: "_Job", out: IO[str], lock: threading.Lock) -> None:
    """Ask the ranks for their flight records (the stop file in this job's folder of ``run_dir``), wait for them,
    print who stopped where. No folder of this job: no rank got as far as its grid, nothing to ask."""
    folder = flight.job_folder(run_dir, os.path.basename(job.tmp))
    if folder is None:
        return
    try:
        with open(os.path.join(folder, flight.STOP_FILE), "w"):
            pass
    except OSError:
        return
    deadline = time.monotonic() + FLIGHT_WAIT_S
    while time.monotonic() < deadline:
        alive = sum(proctree.alive(p) for p in job.rank_pids())
        dumps = len(flight.read_dumps(folder))
        if dumps >= n or (alive == 0 and dumps > 0) or (dumps == 0 and time.monotonic() > deadline - 2.0):
            break
        time.sleep(0.05)
    docs = flight.read_dumps(folder)
    if not docs:
        return
    time.sleep(0.5)             # the ranks' own printed records pass through the output pumps (and mpiexec) first
    lines = [f"axgrid launch: flight recorder (each rank's last collectives: {folder}):"]
    lines += [f"axgrid launch:   {line}" for line in flight.summarize(docs, n)]
    with lock:
        out.write("\n".join(lines) + "\n")
        out.flush()


def launch(n: int, cmd: Sequence[str], *, use_mpi: Optional[bool] = None, threads_per_rank: int = 1,
           out: IO[str] = sys.stdout, timeout_s: Optional[float] = None, grace_s: float = 10.0,
           run_dir: Optional[str] = None) -> int:
    """Run ``cmd`` as ``n`` ranks; return 0 when all succeed, else the first failing rank's exit code.

    ``use_mpi``: None picks mpiexec when it is installed. ``threads_per_rank`` sets OMP_NUM_THREADS unless the
    environment already sets it. ``timeout_s`` ends the whole job (exit code 124) when it runs longer.
    ``grace_s``: how long ranks may take to exit after a forwarded SIGTERM/SIGHUP/SIGINT (e.g. to save a
    checkpoint) before they are killed. ``run_dir``: the run's directory the ranks see as ``AXGRID_RUN_DIR``
    (flight records go to ``run_dir/flight``; default: ``$AXGRID_RUN_DIR``, else inside the job's temporary
    folder, removed at the end). See the module docstring for how a job ends.
    """
    preflight(n, cmd)
    mpiexec = find_mpiexec() if use_mpi in (None, True) else None
    if use_mpi and not mpiexec:
        raise FileNotFoundError("mpiexec not found: pip install 'axgrid[mpi]' (mpi4py + mpich), or use_mpi=False")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank))
    env["PYTHONUNBUFFERED"] = "1"
    # the rendezvous, under mpiexec too: the ranks then never start MPI, whose processes Hydra ends with SIGKILL
    # and its "BAD TERMINATION" banner when one of them leaves with os._exit (as a failing rank does)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="axgrid-launch-") as tmp, _Signals() as signals:
        env[proctree.JOB_VAR] = os.path.basename(tmp)
        env[LAUNCH_DIR_VAR] = tmp
        run_dir = os.path.abspath(run_dir or env.get(RUN_DIR_VAR) or os.path.join(tmp, "run"))
        env[RUN_DIR_VAR] = run_dir
        job = _start(n, cmd, mpiexec, env, tmp)
        pumps = [threading.Thread(target=_pump, args=(p.stdout, pre, out, lock), daemon=True)
                 for p, pre in zip(job.procs, job.prefixes)]
        for t in pumps:
            t.start()
        code, why, sig, grace, stuck = 0, "", signal.SIGTERM, FAILURE_GRACE_S, False
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if signals.first:
                sig, grace = signals.first, grace_s
                code, why = 128 + sig, f"got {signal.Signals(sig).name}; forwarded it to the ranks"
                break
            failed = job.failure()
            if failed:
                code, why = failed[1], f"rank {failed[0]} exited with code {failed[1]}; the other ranks were ended"
                first = errors.first_recorded(tmp, n, failed[0])
                if first is not None and first[1]:   # one of the project's errors: its line, once, is all there is
                    why = f"[{first[0]}] {first[1]}"
                elif first is None:     # a crash, a lost rank or a failed collective: who is stuck where
                    stuck = True        # (else a rank's own exception, its traceback printed: that is the cause)
                break
            if job.done():
                break
            if deadline is not None and time.monotonic() > deadline:
                code, why = 124, f"job exceeded {timeout_s} s, ending all ranks"
                stuck = True
                break
            job.wait_event(0.05)
        if stuck:                                   # a rank failed or the job hung: who is stuck where
            _collect_flight(run_dir, n, job, out, lock)
        _end(job, sig, grace, signals)
        for t in pumps:
            t.join(timeout=2)
        if code:
            with lock:
                out.write(f"{why}\n" if why.startswith("[") else f"axgrid launch: {why}\n")
                out.flush()
    return code


def _wrap(tmp: str, cmd: Sequence[str]) -> int:
    """Run one rank's command under mpiexec: in a process group of its own (its pid in ``rank-R.pid``), its
    output lines prefixed with the rank, forwarded signals passed on; when it fails, the first failure of the
    job is recorded in ``failed`` (``"RANK CODE"``, created once: later failures are effects, not causes).

    Returns 0 however the rank ended: the launcher reads ``failed`` and ends the job itself. A wrapper that
    returned the rank's failure would make Hydra kill the other wrappers, and print its "BAD TERMINATION" banner
    when one of them died of that signal first."""
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "x"))
    pass_fds = tuple(int(os.environ[k]) for k in ("PMI_FD",) if os.environ.get(k, "").isdigit())
    proc = subprocess.Popen(list(cmd), pass_fds=pass_fds, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    for s in FORWARDED:
        signal.signal(s, lambda signum, frame: proctree.signal_groups([proc.pid], signum))
    _write_once(os.path.join(tmp, f"rank-{rank}.pid"), str(proc.pid))
    pump = threading.Thread(target=_pump, args=(proc.stdout, f"[{rank}] ", sys.stdout, threading.Lock()),
                            daemon=True)
    pump.start()
    code = exit_code(proc.wait())
    pump.join(timeout=5)
    if code != 0:
        _write_once(os.path.join(tmp, "failed"), f"{rank} {code}")
    return 0


#: Modules whose ``--grid`` describes a job other than the one launched (priced or tuned, not run): not checked.
OTHER_JOBS_GRID = ("axgrid.perfmodel", "axgrid.kernels")


def _grid_arguments(cmd: Sequence[str]) -> list[str]:
    """The values of ``--grid G`` / ``--grid=G`` in ``cmd`` (none when it runs one of OTHER_JOBS_GRID)."""
    if any(cmd[i] == "-m" and cmd[i + 1].startswith(OTHER_JOBS_GRID) for i in range(len(cmd) - 1)):
        return []
    found = [cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i] == "--grid"]
    return found + [a.split("=", 1)[1] for a in cmd if a.startswith("--grid=")]


def preflight(n: int, cmd: Sequence[str]) -> None:
    """What ``axgrid launch -n N -- CMD`` can refuse before starting a rank: N < 1, no command, a Python script
    that does not exist, a ``--grid`` for CMD that does not parse or does not have N ranks (LaunchError, GridError
    or ValueError: one line each)."""
    if n < 1:
        raise ValueError(f"-n {n}: the number of ranks must be >= 1")
    if not cmd:
        raise ValueError("no command to launch: axgrid launch -n N [--] CMD ...")
    if os.path.basename(cmd[0]).startswith("python") and len(cmd) > 1 and cmd[1].endswith(".py") \
            and not os.path.isfile(cmd[1]):
        raise LaunchError(f"{cmd[1]}: no such script (from {os.getcwd()}); check the path")
    for spec in _grid_arguments(cmd):
        try:
            GridShape.parse(spec, n)
        except WorldSizeMismatch as e:
            raise GridError(f"--grid {spec} needs {e.shape.size} ranks but -n is {n}: use -n {e.shape.size}, or a "
                            f"grid of {n} ranks") from None
        except GridError as e:
            raise GridError(f"--grid {spec}: {e}") from None


def _write_once(path: str, text: str) -> None:
    """Create ``path`` holding ``text``, complete or not at all; an existing ``path`` is left as it is."""
    part = f"{path}.{os.getpid()}.part"
    with open(part, "w") as f:
        f.write(text)
    try:
        os.link(part, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(part)


def main(argv: list[str]) -> int:
    """``python -m axgrid.launch.local --wrap DIR -- CMD ...``: one rank's wrapper under mpiexec (internal)."""
    if len(argv) >= 3 and argv[0] == "--wrap" and argv[2] == "--":
        return _wrap(argv[1], argv[3:])
    raise errors.UsageError("usage: python -m axgrid.launch.local --wrap DIR -- CMD ... (internal; use `axgrid "
                            "launch`)")


if __name__ == "__main__":
    errors.run(main, "python -m axgrid.launch.local")
