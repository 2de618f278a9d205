"""Who says a job's failure: the first rank to fail, once, under any launcher.

When a rank fails after the ranks have met (``torch.distributed`` is initialised), it claims the report in the
rendezvous store every rank already shares -- the default process group's ``TCPStore``, served by rank 0's process
whichever launcher started the job -- with one atomic ``add``: the rank that reads 1 is the first, and says its
error (the project's one line, or a bug's traceback); every later failure is taken for a consequence and stays
quiet (``--debug`` prints them all). A first failure that did not come from a failed collective (an exception in
the rank's own code) is also marked as *the cause*: a rank whose collective then fails because that rank left
skips its flight-recorder dump (:mod:`axgrid.launch.flight`), which would only say that a peer went away.

Before the ranks have met there is no store: :mod:`axgrid.launch.errors` falls back to its rule for errors raised
identically on every rank (rank 0, or ``axgrid launch`` from the ranks' records, says it). A store that does not
answer within ``STORE_WAIT_S`` (rank 0's process is gone, taking the server with it) counts as no store, and so does
a dry run's fake group (:mod:`axgrid.dryrun`).

The store is reached through ``torch.distributed.distributed_c10d._get_default_store``, torch's own accessor of the
store ``init_process_group`` made (private by name: a torch without it counts as no store). It is the one place all
ranks already reach under every launcher, so nothing new is opened (a file in a shared folder would need one; a
second ``TCPStore`` would need the rendezvous address, which under mpiexec only mpi4py knew). Nothing here imports
torch: a process that has not loaded ``torch.distributed`` has no store.
"""
from __future__ import annotations

import contextlib
import datetime
import sys
from typing import Any, Iterator, Optional

#: Store key counting the ranks that failed (the first reads 1).
FAILED_KEY = "axgrid/failed"
#: Store key set by the first failing rank when its failure is its own (not a failed collective): its rank.
CAUSE_KEY = "axgrid/cause"
#: Seconds a store operation may take on the way out (the store's own timeout is the collective timeout).
STORE_WAIT_S = 5.0
#: Attribute set on an exception raised by a failed collective (by the flight recorder): a consequence.
IN_COLLECTIVE = "axgrid_in_collective"


def _store() -> Optional[Any]:
    """The default process group's store, or None (no group, or no such accessor)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    try:
        if dist.get_backend() == "fake":     # a dry run: one rank of a job that is not running
            return None
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


@contextlib.contextmanager
def _briefly(store: Any) -> Iterator[Any]:
    """``store`` with its timeout lowered to ``STORE_WAIT_S`` while open (restored after: a program that catches
    the error goes on with the group's own timeout)."""
    before = store.timeout
    store.set_timeout(datetime.timedelta(seconds=STORE_WAIT_S))
    try:
        yield store
    finally:
        store.set_timeout(before)


def in_collective(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a failed collective (a timeout, a peer that went away)."""
    return bool(getattr(exc, IN_COLLECTIVE, False))


def mark_in_collective(exc: BaseException) -> None:
    """Mark ``exc`` as raised by a failed collective (see :func:`in_collective`)."""
    try:
        setattr(exc, IN_COLLECTIVE, True)
    except (AttributeError, TypeError):
        pass


def claim(rank: int, exc: BaseException) -> Optional[bool]:
    """Claim the report of the job's failure for this rank, failing with ``exc``: True when it is the first rank to
    fail, False when another was, None when there is no store to ask (see the module docstring)."""
    store = _store()
    if store is None:
        return None
    try:
        with _briefly(store):
            first = store.add(FAILED_KEY, 1) == 1
            if first and not in_collective(exc):
                store.set(CAUSE_KEY, str(rank))
        return first
    except Exception:
        return None


def cause_elsewhere() -> bool:
    """Whether another rank has already failed in its own code (so a collective failing now is its consequence)."""
    store = _store()
    if store is None:
        return False
    try:
        with _briefly(store):
            return store.check([CAUSE_KEY])
    except Exception:
        return False
