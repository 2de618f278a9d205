"""The flight recorder: every rank's last collectives, dumped when one fails, times out or stops making progress,
so a stuck job says who is stuck where.

Every collective the communicator posts (:mod:`axgrid.core.comm`) gets a :class:`Record`: its sequence number (per
grid dimension, and overall), dimension, operation, bytes and state -- ``posted``, ``waited`` (the rank called
``wait()``; on a GPU the compute stream now waits for it), ``completed``, or ``failed``. The last ``capacity`` are
kept in a ring. The ranks dump them -- printed to stderr and written to ``<run dir>/flight/JOB/rank-RRRRR.json`` --

- when a collective raises (a timeout on gloo, a broken connection), right before the error propagates -- unless
  another rank has already failed in its own code (:func:`axgrid.launch.report.cause_elsewhere`): the collective
  failed because that rank left, and its error is the one to read;
- from a watchdog thread, when the oldest unfinished collective has been in flight for ``hang_s`` (by default
  0.8 × the collective timeout, so before NCCL's own watchdog aborts the process, which Python cannot catch);
- from the same thread, when another rank or ``axgrid launch`` asks: a rank whose collective failed creates
  ``<run dir>/flight/JOB/stop`` and waits up to ``peer_wait_s`` for the others' dumps before its error ends it (a
  launcher such as Hydra's mpiexec stops passing on the others' output once one rank exited); ``axgrid launch``
  does the same when a rank fails, and waits a moment for the dumps before it ends the others.

:func:`summarize` reads the dumps and says which ranks stopped at which collective; ``axgrid launch`` prints it,
and ``python -m axgrid.launch.flight RUN_DIR`` prints it (for the latest job) for a job started by srun or mpirun.

A run folder is often reused (a rerun, a resumed run with the same ``--run-dir``), so each job writes into a folder
of its own, ``JOB`` = ``YYYYMMDD-HHMMSS-TAG`` (UTC; TAG: ``axgrid launch``'s job folder name, else random), which rank
0 chooses and :func:`axgrid.init` gives every rank with the seed it already broadcasts. An earlier job's stop file
and dumps are then never read: they would make every rank dump at start (switching the hang watchdog off), end
``ask_everyone`` at once, and put the old job in the summary. Clearing the folder at start instead would need every
rank to wait for rank 0's clear (and, on NFS, for other nodes' caches to see it), and would delete the last
failure's records; names that sort by time keep them, and the launcher finds its own job's folder by its TAG. The watchdog reads a GPU
collective's state with ``Work.is_completed()``, which only queries its event: the same code serves gloo and NCCL.

This module imports no torch (the launcher reads the dumps).
"""
from __future__ import annotations

import collections
import json
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional, Sequence

#: Collectives each rank keeps (and prints) by default.
CAPACITY = 32
#: The file the launcher creates to ask every rank for its dump.
STOP_FILE = "stop"
FAILED = "a collective failed"
#: The folder, under a run's directory, that holds one folder of records per job.
FOLDER = "flight"


def job_name(tag: Optional[str] = None) -> str:
    """A job's folder name: ``YYYYMMDD-HHMMSS-TAG`` (UTC now; TAG random when None), sorting by start time."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{tag or secrets.token_hex(4)}"


def job_folders(run_dir: str) -> list[str]:
    """The job folders under ``<run_dir>/flight/``, oldest first."""
    folder = os.path.join(run_dir, FOLDER)
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    return [os.path.join(folder, n) for n in names if os.path.isdir(os.path.join(folder, n))]


def job_folder(run_dir: str, tag: Optional[str] = None) -> Optional[str]:
    """The folder of the latest job under ``run_dir`` (with ``tag``: of the job named ``*-TAG``), or None."""
    found = [f for f in job_folders(run_dir) if tag is None or os.path.basename(f).endswith(f"-{tag}")]
    return found[-1] if found else None


@dataclass
class Record:
    """One collective as this rank posted it."""

    seq: int                 # this rank's collectives so far, every dimension (1-based)
    dim_seq: int             # collectives so far over ``dim`` (the group's own sequence)
    dim: str
    op: str
    nbytes: int
    state: str = "posted"    # posted | waited | completed | failed
    posted_at: float = 0.0   # unix time
    waited_at: Optional[float] = None
    done_at: Optional[float] = None
    error: str = ""
    work: Any = field(default=None, repr=False, compare=False)   # the backend's handle while unfinished

    def finished(self) -> bool:
        """Whether it completed or failed; asks the backend (without blocking) while it is in flight."""
        if self.state in ("completed", "failed"):
            return True
        if self.work is not None:
            try:
                if self.work.is_completed():
                    self.state, self.done_at, self.work = "completed", time.time(), None
                    return True
            except Exception:
                return False
        return False

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "work"}

    def describe(self, now: Optional[float] = None) -> str:
        now = time.time() if now is None else now
        age = f", posted {now - self.posted_at:.1f} s ago" if self.state in ("posted", "waited") else ""
        err = f" ({self.error})" if self.error else ""
        return f"#{self.seq} {self.op} over {self.dim} (its #{self.dim_seq}), {self.nbytes:,} B, {self.state}{age}{err}"


class FlightRecorder:
    """The ring of one rank's last ``capacity`` collectives, and the watchdog that dumps it (see the module
    docstring). ``run_dir``: where dumps go (``<run_dir>/flight/<job>/``, created now) and where the launcher's stop
    file appears; None: printed only. ``job``: the job's folder name, the same on every rank (None: a fresh
    :func:`job_name`, for a recorder of one rank). ``hang_s``: dump when a collective has been unfinished this long
    (None: never). ``cause_elsewhere``: asked when a collective fails; True skips the dump (another rank's own
    error ended the job: :func:`axgrid.launch.report.cause_elsewhere`)."""

    def __init__(self, rank: int, capacity: int = CAPACITY, run_dir: Optional[str] = None,
                 hang_s: Optional[float] = None, poll_s: float = 0.2, out=None, world_size: int = 1,
                 peer_wait_s: float = 1.0, job: Optional[str] = None,
                 cause_elsewhere: Optional[Callable[[], bool]] = None) -> None:
        self.rank, self.capacity, self.hang_s, self.poll_s = rank, capacity, hang_s, poll_s
        self.world_size, self.peer_wait_s = world_size, peer_wait_s
        self.cause_elsewhere = cause_elsewhere
        self.dir = os.path.join(run_dir, "flight", job or job_name()) if run_dir else None
        if self.dir is not None:
            try:
                os.makedirs(self.dir, exist_ok=True)     # where the launcher looks for this job's records
            except OSError:
                pass
        self.records: "collections.deque[Record]" = collections.deque(maxlen=capacity)
        self.stuck: Optional[Record] = None      # the first unfinished collective pushed out of the ring
        self.count = 0
        self.per_dim: dict[str, int] = {}
        self.dumped: Optional[str] = None        # the reason of the dump made, if any (one per incident)
        self.out = out
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if hang_s is not None or self.dir is not None:
            self._thread = threading.Thread(target=self._watch, name=f"axgrid-flight-{rank}", daemon=True)
            self._thread.start()

    # -- recording (the communicator calls these) ------------------------------------------------------------
    def posted(self, dim: str, op: str, nbytes: int, work: Any = None) -> Record:
        with self._lock:
            self.count += 1
            self.per_dim[dim] = self.per_dim.get(dim, 0) + 1
            rec = Record(self.count, self.per_dim[dim], dim, op, int(nbytes), posted_at=time.time(), work=work)
            if len(self.records) == self.capacity and self.stuck is None and not self.records[0].finished():
                self.stuck = self.records[0]     # on a GPU the host runs ahead of a hung collective: keep it
            self.records.append(rec)
        if self.dumped is not None and self.dumped.startswith("no progress"):
            self.dumped = None                   # progress again: a later hang gets its own dump
        return rec

    def waited(self, rec: Record, done: bool) -> None:
        """``wait()`` returned; ``done``: the collective is known complete (a host backend), else only queued."""
        rec.waited_at = time.time()
        if done:
            rec.state, rec.done_at, rec.work = "completed", rec.waited_at, None
        elif rec.state == "posted":
            rec.state = "waited"

    def failed(self, rec: Optional[Record], error: BaseException) -> None:
        """A collective raised: mark it and dump (before the error ends the rank)."""
        what = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        if rec is not None:
            rec.state, rec.error, rec.done_at, rec.work = "failed", what, time.time(), None
        if self.cause_elsewhere is not None and self.cause_elsewhere():
            return                               # a peer's own error ended the job: nothing to add to it
        if not (self.dumped or "").startswith(FAILED):
            self.dump(f"{FAILED} ({what})", force=True)
            self.ask_everyone()

    def ask_everyone(self) -> None:
        """Ask every rank for its dump (the stop file) and wait up to ``peer_wait_s`` for them."""
        if self.dir is None or self.world_size <= 1:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
            with open(os.path.join(self.dir, STOP_FILE), "a"):
                pass
        except OSError:
            return
        deadline = time.monotonic() + self.peer_wait_s
        while time.monotonic() < deadline:
            try:
                if sum(n.startswith("rank-") and n.endswith(".json") for n in os.listdir(self.dir)) >= self.world_size:
                    return
            except OSError:
                return
            time.sleep(0.05)

    # -- dumping -----------------------------------------------------------------------------------------------
    def _ring(self) -> list[Record]:
        """The kept records, the first unfinished one pushed out of the ring (if any) first."""
        records = list(self.records)
        if self.stuck is not None and not self.stuck.finished() and (not records or self.stuck is not records[0]):
            return [self.stuck, *records]
        return records

    def unfinished(self) -> Optional[Record]:
        """The oldest collective still in flight, or None."""
        for rec in self._ring():
            if not rec.finished():
                return rec
        return None

    def dump(self, reason: str, force: bool = False) -> Optional[str]:
        """Print the ring to stderr and write it to ``<run_dir>/flight/rank-RRRRR.json``; returns the file's path
        (None when there is no run directory). Once per incident, unless ``force`` (a later, more telling state:
        the collective failed, or the launcher asks)."""
        with self._lock:
            if self.dumped is not None and not force:
                return None
            self.dumped = reason
            records = self._ring()
        now = time.time()
        for rec in records:
            rec.finished()
        out = self.out or sys.stderr
        pinned = " (the first, unfinished, had left the ring)" if records and records[0] is self.stuck else ""
        lines = [f"axgrid flight recorder, rank {self.rank} ({socket.gethostname()}, pid {os.getpid()}): {reason}; "
                 f"its last {len(records)} of {self.count} collectives{pinned}:"]
        lines += [f"  {r.describe(now)}" for r in records]
        try:
            out.write("\n".join(lines) + "\n")
            out.flush()
        except Exception:
            pass
        if self.dir is None:
            return None
        doc = {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(), "reason": reason, "time": now,
               "collectives": self.count, "records": [r.as_dict() for r in records]}
        try:
            os.makedirs(self.dir, exist_ok=True)
            path = os.path.join(self.dir, f"rank-{self.rank:05d}.json")
            tmp = f"{path}.{os.getpid()}.part"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, path)
            return path
        except OSError:
            return None

    def _watch(self) -> None:
        asked = False
        while not self._stop.wait(self.poll_s):
            if not asked and self.dir is not None and os.path.exists(os.path.join(self.dir, STOP_FILE)):
                asked = True                     # the launcher's request: a fresh dump with the latest states
                if not (self.dumped or "").startswith(FAILED):
                    self.dump("asked for it (another rank stopped)", force=True)
                continue
            if self.hang_s is not None and self.dumped is None:
                rec = self.unfinished()
                if rec is not None and time.time() - rec.posted_at > self.hang_s:
                    self.dump(f"no progress for {time.time() - rec.posted_at:.1f} s in collective #{rec.seq}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.poll_s + 1)


# ------------------------------------------------------------------------------- reading the dumps (the launcher)

def read_dumps(folder: str) -> list[dict]:
    """Every rank's dump in a job's folder (``<run_dir>/flight/JOB``), by rank."""
    docs = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(folder, name)) as f:
                    docs.append(json.load(f))
            except (OSError, ValueError):
                continue
    return sorted(docs, key=lambda d: d["rank"])


def _where(doc: dict) -> tuple:
    """(kind, dim, dim_seq, op, nbytes) of where a rank stopped: its first unfinished collective, else the one it
    completed last."""
    recs = doc.get("records") or []
    for r in recs:
        if r["state"] in ("posted", "waited", "failed"):
            return ("in", r["dim"], r["dim_seq"], r["op"], r["nbytes"], r["state"], r["seq"])
    if recs:
        r = recs[-1]
        return ("after", r["dim"], r["dim_seq"], r["op"], r["nbytes"], r["state"], r["seq"])
    return ("before", "", 0, "", 0, "", 0)


def _ranks(rs: Sequence[int]) -> str:
    return ",".join(str(r) for r in rs)


def summarize(docs: list[dict], world_size: Optional[int] = None) -> list[str]:
    """Lines saying which ranks stopped at which collective (ranks that stopped at the same place together), and
    which ranks left no dump."""
    if not docs:
        return ["no flight records were written"]
    groups: dict[tuple, list[int]] = {}
    for d in docs:
        groups.setdefault(_where(d), []).append(d["rank"])
    lines = []
    for (kind, dim, dseq, op, nbytes, state, seq), rs in sorted(groups.items(), key=lambda kv: kv[1][0]):
        who = f"rank{'s' if len(rs) > 1 else ''} {_ranks(rs)}"
        if kind == "before":
            lines.append(f"{who}: posted no collective")
        elif kind == "in":
            lines.append(f"{who}: stopped in collective #{seq}: {op} over {dim} (its #{dseq}), {nbytes:,} B, {state}")
        else:
            lines.append(f"{who}: completed collective #{seq} ({op} over {dim}, its #{dseq}, {nbytes:,} B) and "
                         f"posted nothing after it")
    if world_size is not None:
        missing = sorted(set(range(world_size)) - {d["rank"] for d in docs})
        if missing:
            lines.append(f"ranks {_ranks(missing)}: left no flight record (killed, or never started)")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        from .errors import UsageError
        raise UsageError("usage: python -m axgrid.launch.flight RUN_DIR|JOB_DIR (prints which ranks of the latest "
                         "job stopped at which collective)")
    folder = args[0] if read_dumps(args[0]) else job_folder(args[0])
    if folder is None:
        raise SystemExit(f"{args[0]}: no flight records (no {FOLDER}/ folder of a job in it)")
    print(f"job {os.path.basename(folder)} ({folder}):")
    docs = read_dumps(folder)
    for line in summarize(docs):
        print(line)
    return 0 if docs else 1


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "python -m axgrid.launch.flight")     # errors said once, as one line (axgrid.launch.errors)
