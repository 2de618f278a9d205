"""How a program of the project ends on an error: the project's own errors as one line, said once, with a
non-zero exit; a traceback only for a bug, or when asked for with ``--debug`` / ``AXGRID_DEBUG=1``.

    if __name__ == "__main__":
        run(main, "train_gpt")          # main(argv) -> a summary, an exit code or None

The project's own errors are bad input, not bugs: ``SystemExit("message")`` from an argument check, an exception
whose class axgrid defines (``GridError``, ``LaunchError``, ``PretrainedError``, ``CheckpointError``,
``PerfModelError``, ...), and a ``ValueError`` (or ``FloatingPointError``) raised by a ``raise`` statement in
axgrid's own code or the project's scripts in experiments/ and examples/ (a check naming the value and the fix).
Everything else -- a ``ValueError`` from inside torch or from a builtin, any other exception, a user's own script's
exception -- is a bug and keeps its traceback.

Once per job, whoever started it, by the first rank to fail:

- after the ranks have met (``torch.distributed`` is initialised) the first rank to fail claims the report in the
  rendezvous store (:mod:`axgrid.launch.report`) and says it -- its one line, prefixed ``[RANK]`` like any rank
  output of ``axgrid launch``, or a bug's traceback; every rank that fails after it stays quiet and leaves a moment
  later (its failure is a consequence: a peer it was in a collective with went away). So an error on rank 5 only
  (a bad shard) is said once, by rank 5, under srun, torchrun, mpiexec and ``axgrid launch`` alike;
- before they have met, the project's errors (argument checks) are raised identically on every rank: rank 0 says
  it, the others stay quiet and leave a moment later, so that a launcher which ends the job at the first failing
  rank (srun ``--kill-on-bad-exit``, Hydra once MPI is up) lets rank 0 say it first;
- one process (world size 1): it prints the line on stderr;
- under ``axgrid launch`` the rank that says it writes its line to ``error-RANK`` in the job's folder instead of
  printing it (before the ranks have met: every rank); the launcher prints it once, prefixed by its rank, and
  nothing else (no "rank R exited" line, no MPI banner). A first rank that printed a bug's traceback leaves an
  empty ``error-RANK``: the launcher then says which rank exited, and asks for no flight records;
- ``--debug``: every rank prints its traceback.

A rank of a job of several leaves with ``os._exit`` (see :mod:`axgrid.launch.teardown`: the others may be blocked in
a collective with it), except where MPI is live in it (a bare mpiexec: :func:`leaves_at_once`). The same rules apply
to an uncaught error in any program that called :func:`axgrid.init`: the teardown hook calls :func:`say`. Nothing
here imports torch, so the launcher and perfmodel use it too.
"""
from __future__ import annotations

import argparse
import contextlib
import linecache
import os
import sys
import time
import traceback
from typing import Any, Callable, Iterator, NoReturn, Optional, Sequence

from . import report, teardown
from .env import LaunchError, detect_launch, launch_dir

#: Environment variable: any value but "" or "0" prints tracebacks for every error (set by ``--debug``).
DEBUG_VAR = "AXGRID_DEBUG"
#: Seconds a rank other than 0 waits before it leaves on an error it does not print (see the module docstring).
QUIET_RANK_DELAY_S = 1.0
#: File, in the job folder of ``axgrid launch``, where rank R records its one-line error.
ERROR_FILE = "error-{rank}"

#: Built-in exceptions that are one of the project's errors when a ``raise`` in axgrid's code raised them: a value
#: check, and a loss that stopped being finite (run_step: "lower --lr").
CHECK_ERRORS = (ValueError, FloatingPointError)

#: The real paths of axgrid's code (the tuner and the performance model are inside it) and, in a checkout, of the
#: project's scripts (experiments/, examples/: their argument checks are the project's too).
_OUR_PACKAGE = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OUR_ROOTS = tuple(os.path.join(folder, "") for folder in
                   (_OUR_PACKAGE, *(os.path.join(os.path.dirname(_OUR_PACKAGE), s) for s in ("experiments", "examples"))))


def _raised_by_our_check(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is a ``raise`` statement in axgrid's code or scripts."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.realpath(tb.tb_frame.f_code.co_filename)
    if not path.startswith(_OUR_ROOTS):
        return False
    return linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).lstrip().startswith("raise")


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the project's own errors (bad input, said as one line) rather than a bug."""
    if isinstance(exc, SystemExit):
        return isinstance(exc.code, str)
    if not isinstance(exc, Exception):
        return False                                    # KeyboardInterrupt, GeneratorExit
    if type(exc).__module__.split(".")[0] == "axgrid":
        return True
    return type(exc) in CHECK_ERRORS and _raised_by_our_check(exc)


class UsageError(SystemExit):
    """A bad command line (argparse's complaint), raised instead of argparse printing its usage on every rank;
    exit code 2, as argparse's."""
    exit_code = 2


def usage_errors_raise(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` raise :class:`UsageError` ``"error: MESSAGE (see PROG --help)"`` on a bad command line,
    so that :func:`run` says it once; returns ``parser``."""
    def error(message: str) -> NoReturn:
        raise UsageError(f"error: {message} (see {parser.prog} --help)")

    parser.error = error  # type: ignore[method-assign]
    return parser


def debugging() -> bool:
    """Whether ``--debug`` or ``AXGRID_DEBUG=1`` asked for tracebacks."""
    return os.environ.get(DEBUG_VAR, "") not in ("", "0")


def program_name() -> str:
    """What the running program is called: ``train_gpt`` for a script, ``axgrid.demo`` for ``python -m``."""
    orig = getattr(sys, "orig_argv", [])
    if "-m" in orig[:-1]:
        return orig[orig.index("-m") + 1]
    return os.path.splitext(os.path.basename(sys.argv[0] or "python"))[0] or "python"


def one_line(exc: BaseException, prog: str) -> str:
    """The error as one line, ``prog: message`` (the program named once)."""
    text = str(exc.code) if isinstance(exc, SystemExit) else str(exc)
    text = " ".join(part.strip() for part in text.splitlines() if part.strip()) or type(exc).__name__
    return text if text.startswith(f"{prog}:") or text.startswith(f"{prog} ") else f"{prog}: {text}"


def _position() -> tuple[int, int]:
    """(rank, world size) from the launcher's variables (no MPI, no collective). When they describe no usable launch,
    the rank they gave (a world of at least rank + 1), so that rank 0 alone says the error; else (0, 1)."""
    try:
        launch = detect_launch(use_mpi=False)
    except LaunchError as e:
        return (0, 1) if e.rank is None else (e.rank, e.rank + 1)
    return launch.rank, launch.world_size


def record(folder: str, rank: int, line: str) -> bool:
    """Write ``line`` as rank ``rank``'s error in the launcher's job folder (complete or not at all)."""
    path = os.path.join(folder, ERROR_FILE.format(rank=rank))
    part = f"{path}.{os.getpid()}.part"
    try:
        with open(part, "w") as f:
            f.write(line + "\n")
        os.replace(part, path)
        return True
    except OSError:
        return False


def recorded(folder: str, rank: int) -> Optional[str]:
    """The error line rank ``rank`` recorded in a job folder ("" for a traceback it printed itself), or None when
    it recorded nothing (the launcher's side)."""
    try:
        with open(os.path.join(folder, ERROR_FILE.format(rank=rank))) as f:
            return f.read().strip()
    except OSError:
        return None


def first_recorded(folder: str, world_size: int, failed: str) -> Optional[tuple[str, str]]:
    """(rank, line) of the error to say for a job of ``axgrid launch``: the record of ``failed`` (the first rank
    that exited, by the launcher's reckoning), else the first rank's that recorded one (the rank that claimed the
    report may leave after a quiet one); None when no rank recorded an error."""
    ranks = ([failed] if failed.isdigit() else []) + [str(r) for r in range(world_size)]
    for rank in ranks:
        line = recorded(folder, int(rank))
        if line is not None:
            return rank, line
    return None


def say(exc: BaseException, prog: str) -> int:
    """Say ``exc`` (one of the project's errors) once per job as the module docstring describes; its exit code."""
    line = one_line(exc, prog)
    rank, world = _position()
    first = report.claim(rank, exc)
    folder = launch_dir()
    spoke = False
    if first is False:
        pass                                            # another rank failed first: it says its error
    elif folder is not None and record(folder, rank, line):
        spoke = True                                    # the launcher prints it
    elif first or rank == 0:
        print(f"[{rank}] {line}" if first and world > 1 else line, file=sys.stderr, flush=True)
        spoke = True
    if world > 1 and not spoke:
        time.sleep(QUIET_RANK_DELAY_S)
    return getattr(exc, "exit_code", 1)


def say_bug(exc: BaseException, print_traceback: Callable[[], None]) -> None:
    """Say a bug (any exception but the project's own) once per job: the first rank to fail prints its traceback
    through ``print_traceback`` (and, under ``axgrid launch``, leaves an empty record, unless its collective failed:
    then the launcher asks for flight records); a rank that failed after it stays quiet and leaves a moment later.
    Every rank prints it with ``--debug``, or when there is no store to ask."""
    rank, world = _position()
    first = None if debugging() else report.claim(rank, exc)
    if first is False:
        time.sleep(QUIET_RANK_DELAY_S)
        return
    print_traceback()
    folder = launch_dir()
    if first and folder is not None and not report.in_collective(exc):
        record(folder, rank, "")


def mpi_live() -> bool:
    """Whether MPI is initialised and not finalised in this process (a bare mpiexec/mpirun: axgrid.init keeps it)."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def leaves_at_once() -> bool:
    """Whether a rank stopping on one of the project's errors leaves with ``os._exit``: in a job of several ranks,
    whose others may be blocked in a collective with it, unless MPI is live here. Hydra answers a process that
    leaves MPI without its exit handlers by killing the whole job with SIGKILL and its "BAD TERMINATION" banner;
    a normal exit finalises MPI, which returns once every rank (all raising the same error) has finalised."""
    return _position()[1] > 1 and not mpi_live()


def leave(code: int) -> NoReturn:
    """End this process with ``code``: at once (``os._exit``, after flushing) when :func:`leaves_at_once`, with a
    normal exit otherwise."""
    if leaves_at_once():
        teardown.flush_all()
        os._exit(code)
    sys.exit(code)


def split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (before a ``--``, after which the words belong to another command), and
    whether it was there."""
    argv = list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:end] if a != "--debug"]
    return head + argv[end:], len(head) < end


@contextlib.contextmanager
def usage_errors_raise_in_every_parser() -> Iterator[None]:
    """While it is open, every ``argparse`` parser raises :class:`UsageError` on a bad command line (as
    :func:`usage_errors_raise` makes one parser do), so that an entry point's usage error is said once, by
    :func:`run`, without each script wiring its parsers (a new script is covered as it is written)."""
    previous = argparse.ArgumentParser.error

    def error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
        raise UsageError(f"error: {message} (see {parser.prog} --help)")

    argparse.ArgumentParser.error = error  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = previous  # type: ignore[method-assign]


def run(main: Callable[[list[str]], Any], prog: str, argv: Optional[Sequence[str]] = None) -> NoReturn:
    """Run an entry point's ``main(argv)`` and exit: 0 (or the int ``main`` returns) on success; on one of the
    project's errors (a bad command line included: :func:`usage_errors_raise_in_every_parser`), its line said once
    and exit code 1 (or the ``SystemExit`` code: 2 for a bad command line); a bug raises on, with its traceback (said
    by the first rank to fail only: :func:`say_bug`, through the hook of :mod:`axgrid.launch.teardown`). ``--debug``
    (removed from ``argv``) sets ``AXGRID_DEBUG=1`` for this process and what it starts.

    Every entry point of the project ends its ``if __name__ == "__main__":`` block with it (scripts in
    ``experiments/`` and ``examples/``, ``python -m`` modules, the ``axgrid`` command);
    tests/scripts/test_entry_points.py finds them all and holds each to it."""
    argv, debug = split_debug(sys.argv[1:] if argv is None else argv)
    if debug:
        os.environ[DEBUG_VAR] = "1"
    try:
        with usage_errors_raise_in_every_parser():
            result = main(argv)
    except (SystemExit, Exception) as e:
        if not is_user_error(e):
            raise
        if debugging():
            traceback.print_exc()
            leave(getattr(e, "exit_code", 1))
        leave(say(e, prog))
    sys.exit(result if isinstance(result, int) and not isinstance(result, bool) else 0)
