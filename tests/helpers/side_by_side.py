"""Run a module's independent jobs side by side, each test taking its own job's result.

    @pytest.fixture(scope="module")
    def jobs():
        with side_by_side({"raise": partial(run_job, "plain", "raise", tmp), ...}) as started:
            yield started                          # every job has started; leaving waits for all of them

    def test_raise(jobs):
        job = outcome(jobs["raise"], timeout_s=600)   # what the job returned, or the exception it raised

On a 2-core machine, jobs that wait (a collective timeout, a scheduler's period, a launcher's teardown) overlap
instead of adding up; a test waits only for its own job, never for the whole module's.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterator, Mapping, Optional


@contextmanager
def side_by_side(calls: Mapping[Hashable, Callable[[], Any]],
                 at_once: Optional[int] = None) -> Iterator[dict[Hashable, Future]]:
    """Start every call of ``calls`` in its own thread (at most ``at_once`` at a time, in the order given: put the
    longest first); yields their futures by key. Leaving the block waits until every call has returned (each must
    bound its own waits)."""
    with ThreadPoolExecutor(max_workers=at_once or max(1, len(calls)), thread_name_prefix="side-by-side") as pool:
        yield {key: pool.submit(call) for key, call in calls.items()}


def outcome(future: Future, timeout_s: float) -> Any:
    """The result of a job started by :func:`side_by_side` (its exception re-raised), waiting at most ``timeout_s``."""
    return future.result(timeout=timeout_s)
