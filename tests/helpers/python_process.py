"""``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) for the tests, without a fresh interpreter: the script runs as
``__main__`` in a fresh process of the forkserver (``axgrid.testing.isolated.run_isolated``), which has torch, the
runtime and the tests' preloads imported already, the seconds a fresh ``import torch`` or ``transformers`` takes.
Its exit status, stdout and stderr come back as a finished subprocess's.

    done = run_python(["experiments/checks/memory_check.py", "--device", "cpu"])    # a CompletedProcess

:func:`run_entry_point` runs one in the calling process instead (on the session's gloo ranks: ``ranks(n,
run_entry_point, words, root)``, what ``axgrid launch -n N -- python ...`` starts).
"""
from __future__ import annotations

import io
import os
import runpy
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

from axgrid.testing.isolated import run_isolated


def _python_main(argv: list[str]) -> tuple[int, str, str]:
    """``python *argv`` in this (throwaway) process, as its own interpreter runs it: ``sys.argv``, the script's folder
    (``-m``: the working directory) first on the module path, run as ``__main__``, file descriptors 1 and 2
    captured; an exception's traceback on stderr and exit status 1. (exit status, stdout, stderr)."""
    import os
    import runpy
    import tempfile
    import traceback

    import pytest

    module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, pytest.MonkeyPatch.context() as mp:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        mp.setattr(sys, "argv", [target, *args])
        mp.syspath_prepend(os.getcwd() if module else os.path.dirname(os.path.abspath(target)))
        try:
            if module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:                       # sys.exit("message"): the message on stderr, exit status 1
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


def run_python(argv: list[str], timeout_s: float = 300.0, preload: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """What ``subprocess.run([sys.executable, *argv], capture_output=True, text=True)`` gives, the script run in a
    fresh forkserver process (module docstring); ``preload``: more modules for the forkserver, when this call
    starts it."""
    code, out, err = run_isolated(_python_main, list(argv), timeout_s=timeout_s, preload=preload)
    return subprocess.CompletedProcess([sys.executable, *argv], code, out, err)


def run_entry_point(words: list[str], root: str) -> tuple[int, str]:
    """``python SCRIPT ARGS``, ``python -m MODULE ARGS`` or ``axgrid ARGS`` (``words``), its ``__main__`` block run
    in this process from ``root``: (exit code, what it printed)."""
    out, argv, cwd = io.StringIO(), sys.argv, os.getcwd()
    os.chdir(root)
    try:
        with redirect_stdout(out), redirect_stderr(out):
            try:
                if words[0] == "axgrid":
                    sys.argv = words
                    runpy.run_module("axgrid.cli", run_name="__main__", alter_sys=True)
                elif words[1] == "-m":
                    sys.argv = [words[2], *words[3:]]
                    runpy.run_module(words[2], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = words[1:]
                    runpy.run_path(os.path.join(root, words[1]), run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
        os.chdir(cwd)
    return code, out.getvalue()
