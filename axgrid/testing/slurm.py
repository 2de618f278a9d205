"""A private one-node Slurm cluster for the tests: munged, slurmctld and slurmd on this machine, everything
(configuration, state, spool, logs, munge key and socket) under one folder, on ports nobody else uses.

    cluster = SlurmCluster(tmp_path).start()     # returns once the node is idle
    subprocess.run(["srun", "-n", "4", ...], env=cluster.env)
    cluster.stop()                                # every daemon (and slurmstepd) gone, checked by process id

The node declares more CPUs than the machine has (``SlurmdParameters=config_overrides``) and the partition
oversubscribes them (``OverSubscribe=FORCE``), so several small jobs run side by side on 2 cores; processes are
tracked through /proc (``proctrack/linuxproc``, ``task/none``: no cgroups). Its name is this machine's host name, so
the first host of ``SLURM_JOB_NODELIST`` resolves as it does on a real cluster (``axgrid.launch.env`` meets there).
Accounting: there is no database daemon (``accounting_storage/none``); finished jobs are recorded by
``jobcomp/filetxt``, which ``sacct --completion`` reads (:meth:`SlurmCluster.completion`: state and exit code).
``FirstJobId`` is random (two clusters on one machine derive different rendezvous ports from their job ids), and
chosen so that those ports, 20000 + job id % 20000, are below the kernel's ephemeral ports. Every daemon carries
``AXGRID_LAUNCH_JOB=<cluster id>`` in its environment (slurmstepd inherits it from slurmd), so
:mod:`axgrid.launch.proctree` finds what is left of the cluster however it was forked.

Written by hand rather than taken from a package: what exists (docker images, the Slurm test suite's harness) either
needs a container runtime or a system-wide installation in /etc.
"""
from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from axgrid.launch import proctree

#: The folder that holds the axgrid package (a checkout's root): on the jobs' PYTHONPATH, the default cwd.
ROOT = Path(__file__).resolve().parents[2]
DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("srun", "sbatch", "scancel", "sinfo", "squeue", "sacct", "scontrol")
INSTALL_HINT = "install Slurm: sudo apt-get install slurm-wlm (Debian/Ubuntu; brings munge)"


def missing() -> list[str]:
    """The Slurm and munge programs this module needs that are not installed."""
    found = {p: shutil.which(p) or (shutil.which(p, path="/usr/sbin:/sbin")) for p in DAEMONS + COMMANDS}
    return [p for p, where in found.items() if not where]


def _program(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin") or name


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive TCP ports, all free right now, above the ones axgrid.launch.env derives from
    Slurm job ids (20000-39999) and outside the kernel's ephemeral range where possible."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(40000, 60000 - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free TCP ports between 40000 and 60000")


def _node_name() -> str:
    """This machine's short host name when it resolves (as node names do on a cluster), else localhost."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        return "localhost"


@dataclass
class Completion:
    """What Slurm recorded for a finished job (``sacct --completion``)."""

    job_id: int
    name: str
    state: str          # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: str      # "CODE:SIGNAL", e.g. "0:0", "1:0", "0:15"
    elapsed: str


class SlurmCluster:
    """One controller, one node, one partition (``debug``), all under ``root``; see the module docstring."""

    def __init__(self, root: Path, cpus: int = 512) -> None:
        self.root = Path(root)
        self.cpus = cpus
        self.id = f"axgrid-slurm-{uuid.uuid4().hex[:12]}"
        self.node = _node_name()
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.log_dir = self.root / "log"
        self.pids: dict[str, int] = {}
        # axgrid.launch.env meets on port 20000 + job id % 20000 under srun: start where those ports are below the
        # kernel's ephemeral range (32768-), which other programs' outgoing connections take
        self.first_job_id = 20000 * random.randrange(1, 100) + random.randrange(1000, 11000)
        base = _free_ports(2 + 64)
        self.ctld_port, self.slurmd_port, self.srun_ports = base, base + 1, (base + 2, base + 65)
        self.env = self._client_env()

    # ---- configuration ----------------------------------------------------------------------------------------
    def _client_env(self) -> dict[str, str]:
        """The environment for commands and jobs on this cluster: its slurm.conf, this Python's bin/ first on PATH
        (``python`` in a batch script is this interpreter), the checkout on PYTHONPATH, and no Slurm variables of
        an enclosing job (pytest itself may run inside one)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        bindir = os.path.dirname(sys.executable)
        env.update(SLURM_CONF=str(self.conf), PATH=f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}",
                   PYTHONPATH=f"{ROOT}{os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else ''}",
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        return env

    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o711)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        user = pwd.getpwuid(os.getuid()).pw_name
        lines = [
            f"ClusterName={self.id[-12:]}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}", f"SlurmdPort={self.slurmd_port}",
            f"SrunPortRange={self.srun_ports[0]}-{self.srun_ports[1]}",
            f"SlurmUser={user}", f"SlurmdUser={user}",    # (root here; slurmd as another user runs only its jobs)
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}", f"SlurmdLogFile={self.log_dir / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={r / 'jobcomp.txt'}",
            "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin", "SchedulerParameters=sched_interval=1",   # a follow-up starts in 1 s
            "MpiDefault=none", "ReturnToService=2", "KillWait=2", "InactiveLimit=0", "MinJobAge=600",
            f"FirstJobId={self.first_job_id}",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    # ---- start / stop ---------------------------------------------------------------------------------------
    def _daemon_env(self) -> dict[str, str]:
        return dict(self.env, **{proctree.JOB_VAR: self.id})

    def _spawn(self, name: str, argv: Sequence[str], pid_file: Path, timeout_s: float = 20.0) -> None:
        """Start a daemon that forks into the background and writes ``pid_file``; remember its pid."""
        res = subprocess.run([_program(argv[0]), *argv[1:]], env=self._daemon_env(), capture_output=True,
                             text=True, timeout=timeout_s)
        if res.returncode != 0:
            raise RuntimeError(f"{name} did not start (exit {res.returncode}): {res.stderr.strip()}\n"
                               f"{self.log_tail(name)}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.pids[name] = int(pid_file.read_text().split()[0])
                return
            except (OSError, ValueError, IndexError):
                time.sleep(0.05)
        raise RuntimeError(f"{name} wrote no pid file {pid_file} within {timeout_s} s\n{self.log_tail(name)}")

    def start(self, timeout_s: float = 60.0) -> "SlurmCluster":
        """Write the configuration, start munged, slurmctld and slurmd, and wait until the node is idle."""
        absent = missing()
        if absent:
            raise RuntimeError(f"not installed: {', '.join(absent)}; {INSTALL_HINT}")
        self._write_config()
        m = self.root / "munge"
        try:
            self._spawn("munged", ["munged", "--force", f"--socket={self.munge_socket}",
                                   f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                                   f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"],
                        m / "munged.pid")
            self._spawn("slurmctld", ["slurmctld", "-i", "-f", str(self.conf)], self.root / "slurmctld.pid")
            self._spawn("slurmd", ["slurmd", "-N", self.node, "-f", str(self.conf)], self.root / "slurmd.pid")
            self.wait_idle(timeout_s)
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def restart_controller(self, timeout_s: float = 20.0) -> None:
        """Stop slurmctld and start it again on the same state (jobs and steps keep running; client commands retry
        while it is away). A controller checks the time limits -- and sends the --signal warnings that are due --
        every 30 s from its start: after a restart, the next check comes 30 s later, not at a point of the old
        controller's period."""
        pid = self.pids["slurmctld"]
        os.kill(pid, signal.SIGTERM)
        if not proctree.wait_gone([pid], time.monotonic() + timeout_s):
            raise RuntimeError(f"slurmctld {pid} still running {timeout_s} s after SIGTERM")
        (self.root / "slurmctld.pid").unlink(missing_ok=True)
        self._spawn("slurmctld", ["slurmctld", "-i", "-f", str(self.conf)], self.root / "slurmctld.pid")

    def wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            res = self.command(["sinfo", "-h", "-n", self.node, "-o", "%T"], check=False)
            state = res.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        raise RuntimeError(f"node {self.node} is {state or 'unknown'!r}, not idle, after {timeout_s} s\n"
                           f"{self.log_tail('slurmctld')}\n{self.log_tail('slurmd')}")

    def stop(self, check: bool = True, timeout_s: float = 20.0) -> None:
        """Cancel what still runs, stop the daemons (SIGTERM, then SIGKILL), and check by process id that every
        daemon and every slurmstepd of this cluster is gone (raises RuntimeError otherwise, after killing them)."""
        if "slurmctld" in self.pids and proctree.alive(self.pids["slurmctld"]):
            self.command(["scancel", "--quiet", "--partition=debug"], check=False)
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and self.queue():
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):    # the node first, munge (their authentication) last
            pid = self.pids.get(name)
            if pid and proctree.alive(pid):
                os.kill(pid, signal.SIGTERM)
                if not proctree.wait_gone([pid], time.monotonic() + timeout_s):
                    os.kill(pid, signal.SIGKILL)
        daemons = [pid for pid in self.pids.values() if proctree.alive(pid)]
        left = proctree.job_pids(self.id)
        proctree.kill_job(self.id)
        if check and (daemons or left):
            raise RuntimeError(f"the cluster's processes outlived stop(): daemons {daemons}, tagged {left}")

    # ---- using it -------------------------------------------------------------------------------------------
    def command(self, argv: Sequence[str], check: bool = True, timeout_s: float = 60.0,
                **kwargs) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster (text output captured)."""
        res = subprocess.run([_program(argv[0]), *argv[1:]], env=kwargs.pop("env", self.env), capture_output=True,
                             text=True, timeout=timeout_s, **kwargs)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
        return res

    def sbatch(self, *args: str, env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None) -> int:
        """Submit a batch job; returns its id."""
        res = self.command(["sbatch", "--parsable", *args], env=env or self.env, cwd=cwd or ROOT)
        return int(res.stdout.strip().split(";")[0])

    def queue(self) -> list[str]:
        """``JOBID STATE NAME`` of every job still known to the controller as pending or running."""
        res = self.command(["squeue", "-h", "-o", "%i %T %j"], check=False)
        return [line for line in res.stdout.splitlines() if line.strip()]

    def completion(self, job_id: Optional[int] = None, name: Optional[str] = None) -> list[Completion]:
        """Finished jobs as recorded by jobcomp/filetxt (``sacct --completion``), oldest first."""
        argv = ["sacct", "--completion", "--parsable2", "--noheader", "--format=JobID,JobName,State,ExitCode,Elapsed"]
        if job_id is not None:
            argv.append(f"--jobs={job_id}")
        rows = []
        for line in self.command(argv).stdout.splitlines():
            jid, jname, state, code, elapsed = line.split("|")
            if name is None or jname == name:     # (sacct's own --name does not filter completion records)
                rows.append(Completion(int(jid), jname, state, code, elapsed))
        return rows

    def wait_done(self, job_id: int, timeout_s: float) -> Completion:
        """Wait until ``job_id`` has finished and its completion record is written; return the record."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rows = self.completion(job_id)
            if rows:
                return rows[-1]
            time.sleep(0.25)
        raise TimeoutError(f"job {job_id} still not finished after {timeout_s} s: {self.queue()}")

    def wait_done_named(self, name: str, timeout_s: float) -> Completion:
        """Wait for the completion record of the (one) job named ``name``; return it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rows = self.completion(name=name)
            if rows:
                return rows[-1]
            time.sleep(0.25)
        raise TimeoutError(f"no job named {name} finished within {timeout_s} s: {self.queue()}")

    def steps_alive(self, job_id: int) -> list[int]:
        """Pids of the slurmstepd processes of ``job_id`` still alive."""
        tag = f"slurmstepd: [{job_id}."
        return [p for p in proctree.job_pids(self.id) if tag in _cmdline(p)]

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.root / "munge" / "munged.log" if name == "munged" else self.log_dir / f"{name}.log"
        try:
            return f"--- {path} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"--- {path}: no log ---"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
