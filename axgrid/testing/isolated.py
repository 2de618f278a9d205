"""A function in a fresh process of the forkserver, for tests whose subject can abort the process (the dry run's
CUDA device guard, torch's PrivateUse1 registration, which cannot be undone): an abort cannot take pytest with it."""
from __future__ import annotations

import gc
import traceback
from typing import Any, Callable

import torch


def _child(conn, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    try:
        torch.set_num_threads(1)
        gc.freeze()     # the forkserver's imports stay for good: a full collection need not walk them
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


__all__ = ["IsolatedFailure", "run_isolated"]
