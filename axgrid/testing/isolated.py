"""A function in a fresh process of the forkserver, for tests whose subject can abort the process (the dry run's
CUDA device guard, torch's PrivateUse1 registration, which cannot be undone): an abort cannot take pytest with it.
And ``python SCRIPT ARGS`` (or ``-m MODULE``) run the same way, without the seconds a fresh interpreter spends
importing torch."""
from __future__ import annotations

import subprocess
import sys
import traceback
from typing import Any, Callable

import torch


def _child(conn, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    try:
        torch.set_num_threads(1)
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


class IsolatedFailure(RuntimeError):
    """The function raised, died (an abort) or outlived its time in its own process."""


def run_isolated(fn: Callable[..., Any], *args: Any, timeout_s: float = 300.0, preload: tuple[str, ...] = (),
                 **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a fresh process of the forkserver (which has torch and the runtime preloaded, as
    :class:`axgrid.testing.RankPool`'s ranks; ``preload``: more modules, when this call starts the forkserver); its
    result, or :class:`IsolatedFailure` with its traceback or exit code. ``fn`` must be importable (module level)."""
    from .pool import forkserver_context
    ctx = forkserver_context(preload)
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise IsolatedFailure(f"{fn.__name__} still running after {timeout_s} s"
                                  if proc.is_alive() else f"{fn.__name__} died with exit code {proc.exitcode}")
        status, value = parent.recv()
    except EOFError:
        proc.join(5)
        raise IsolatedFailure(f"{fn.__name__} died with exit code {proc.exitcode} (a signal: -N)") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
    if status != "ok":
        raise IsolatedFailure(f"{fn.__name__} raised:\n{value}")
    return value


def _python_main(argv: list[str]) -> tuple[int, str, str]:
    """``python *argv`` (a script and its arguments, or ``-m MODULE`` and its) in this process, as its own
    interpreter would run it: ``sys.argv``, the script's folder (or the working directory) first on ``sys.path``,
    run as ``__main__``; file descriptors 1 and 2 captured. (exit code, stdout, stderr)."""
    import os
    import runpy
    import tempfile

    module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.argv = [target, *args]
        sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(target)))
        try:
            if module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:                       # sys.exit("message"): said on stderr, exit status 1
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def run_python_isolated(argv: list[str], timeout_s: float = 300.0,
                        preload: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True)`` without a fresh interpreter: the
    script (or ``-m MODULE``) runs as ``__main__`` in a fresh process of the forkserver (:func:`run_isolated`), which
    has torch, the runtime and ``preload`` imported already (seconds a fresh ``import torch`` or ``transformers``
    takes). Its exit status, stdout and stderr, as the subprocess's."""
    code, out, err = run_isolated(_python_main, list(argv), timeout_s=timeout_s, preload=preload)
    return subprocess.CompletedProcess([sys.executable, *argv], code, out, err)


__all__ = ["IsolatedFailure", "run_isolated", "run_python_isolated"]
