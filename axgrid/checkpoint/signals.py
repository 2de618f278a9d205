"""Save-on-signal: SIGTERM / SIGUSR1 become a stop request all ranks agree on at a step boundary."""
from __future__ import annotations

import signal
from typing import Any, Iterable, Optional

from ..io import agree

class SaveOnSignal:
    """Turn SIGTERM / SIGUSR1 into a stop request that all ranks agree on at a step boundary.

    ``with SaveOnSignal(grid) as stop:`` installs the handlers (the previous ones come back on exit); a signal
    only sets a flag. ``stop.should_stop()`` is collective (a one-integer all-reduce over the grid): call it on
    every rank at the same step boundaries; it returns True on every rank once any rank got a signal, and
    ``stop.stopped`` stays True afterwards. Then save and leave the training loop; a job killed at its time
    limit (Slurm: ``#SBATCH --signal=USR1@120`` sends SIGUSR1 120 s before) resumes from that checkpoint.
    Handlers can only be installed in the main thread.
    """

    def __init__(self, grid=None, signals: Iterable[int] = (signal.SIGTERM, signal.SIGUSR1)) -> None:
        self.grid = grid
        self.signals = tuple(signals)
        self.received: Optional[int] = None     # the first signal this rank got
        self.stopped = False                    # all ranks agreed to stop
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum

    def install(self) -> "SaveOnSignal":
        """Install the handlers (what ``with`` does on entry); returns self."""
        for s in self.signals:
            if s not in self._previous:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def uninstall(self) -> None:
        """Put the previous handlers back (what ``with`` does on exit)."""
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def __enter__(self) -> "SaveOnSignal":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    @property
    def requested(self) -> bool:
        """This rank got a signal (local; no communication)."""
        return self.received is not None

    @property
    def signal_name(self) -> Optional[str]:
        return None if self.received is None else signal.Signals(self.received).name

    def should_stop(self) -> bool:
        """Collective: True on every rank when any rank got one of the signals."""
        if not self.stopped:
            (n,) = agree(self.grid, [int(self.requested)])
            self.stopped = n > 0
        return self.stopped
