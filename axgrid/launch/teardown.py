"""How a rank leaves the job: at once when it fails; with its process groups released while Python is still
whole when it succeeds.

Failure. From the start of ``axgrid.init`` (not in an interactive session), an uncaught exception that is one of
the project's own errors is said as one line, once per job (:func:`axgrid.launch.errors.say`; its traceback only
with ``AXGRID_DEBUG=1``); any other prints its traceback -- on the first rank to fail only, once the ranks have met
(:func:`axgrid.launch.errors.say_bug`): the others' "Connection closed" errors are its consequences. In a job of several ranks the process then flushes open
files and ends at once with ``os._exit`` (exit code 1; 130 for KeyboardInterrupt): no atexit handlers, no
interpreter teardown. Otherwise mpi4py's atexit ``MPI_Finalize`` waits for every other rank -- which are blocked in a
collective with this one -- and the job sat until the collective timeout; and interpreter teardown with live
gloo groups is where the exit-134 abort below happens. The other ranks see the closed connections at their
next collective with this rank and fail the same way. Under a bare mpiexec, a rank that leaves MPI
unfinalised makes Hydra end the whole job at once, with that rank's exit code (under ``axgrid launch`` the ranks
do not start MPI -- the launcher gives them their rendezvous address -- and the launcher ends the job).

Success. ``Grid.destroy()`` releases the groups and drops every reference to them, so gloo joins its worker
and network threads right there; a grid still alive when the program ends is destroyed by an atexit handler,
which runs before mpi4py's ``MPI_Finalize`` and before the interpreter tears down its modules. Before, the
groups outlived ``destroy()`` (the grid stayed referenced) and died during interpreter finalisation, when a
gloo thread that releases a Python-owned tensor (of a finished collective) can no longer take the GIL: CPython
ends such a thread with ``pthread_exit``, whose unwinding through a C++ ``noexcept`` frame calls
``std::terminate`` -- "terminate called without an active exception", exit 134. It showed under mpiexec,
where the main thread sits in ``MPI_Finalize`` at exit while such a thread waits for the GIL.
"""
from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import warnings
from types import TracebackType
from typing import Callable, Optional


def flush_all() -> None:
    """Flush stdout, stderr and every open file written through Python (os._exit would drop their buffers)."""
    with warnings.catch_warnings():     # isinstance on every live object touches deprecated module attributes
        warnings.simplefilter("ignore")
        files = [o for o in gc.get_objects() if isinstance(o, io.IOBase)]
    for f in [sys.stdout, sys.stderr, *files]:
        try:
            if not f.closed and f.writable():
                f.flush()
        except Exception:
            pass


def _fail_fast(previous: Callable[..., object], running: list[bool], world_size: int) -> Callable[..., None]:
    """A hook that says one of the project's errors once, or prints a bug's traceback through ``previous``; then,
    in a job of several ranks, exits at once. Hooks installed later (torch's rank prefix, which prints through a
    buffer) may wrap it: only the outermost of ours exits, after everything was printed."""
    def hook(kind: type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
        if running:                     # called from inside another hook wrapping ours: just print
            previous(kind, value, tb)
            return
        from . import errors
        running.append(True)
        code = 130 if issubclass(kind, KeyboardInterrupt) else 1
        at_once = world_size > 1
        try:
            if errors.is_user_error(value) and not errors.debugging():
                code = errors.say(value, errors.program_name())
                at_once = errors.leaves_at_once()
            else:               # a bug: its traceback, from the first rank to fail only (axgrid.launch.report)
                errors.say_bug(value, lambda: previous(kind, value, tb))
        finally:
            flush_all()
            if at_once:
                os._exit(code)
            running.clear()     # Python exits with code 1 after the hook

    hook.axgrid_fail_fast = True  # type: ignore[attr-defined]
    return hook


#: Non-empty while one of our hooks runs (shared by all of them: nested ones only print).
_RUNNING: list[bool] = []


def install(release: Callable[[], None], world_size: int) -> None:
    """Run ``release`` at exit (before mpi4py's ``MPI_Finalize``: call this after MPI is initialised) and, outside
    an interactive session, say the project's uncaught errors once and, in a job of several ranks, make an
    uncaught exception end this rank at once.
    Call it again after ``init_process_group`` (which wraps the hook) so that ours is outermost."""
    interactive = hasattr(sys, "ps1") or sys.flags.interactive
    if not interactive and not getattr(sys.excepthook, "axgrid_fail_fast", False):
        sys.excepthook = _fail_fast(sys.excepthook, _RUNNING, world_size)
    atexit.unregister(release)
    atexit.register(release)
