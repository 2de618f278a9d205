"""The one place that knows whether a backward pass is running, and the one end-of-backward of the runtime.

A :class:`BackwardPass` holds the runtime's ordered steps (built once by :class:`axgrid.core.runtime.Runtime`):

- ``begin``: run at the first event of a backward that :meth:`BackwardPass.arm` sees, before any gradient is
  written -- the data-parallel buckets prepare buffers that a reduction in an earlier backward of this step left
  holding a mean (``zero=1``);
- ``end``: run by one autograd engine callback when the backward has finished, in order -- the weight prefetcher
  forgets the pass (OAG), the ORS pipeline completes its last gradient collectives and hands the gradients on, then
  the data-parallel buckets post what is left and complete their reductions over d.

Whatever sees a gradient event (a layer's backward, a parameter's hook, the pipeline) calls ``arm()``; it is cheap
after the first call of a pass. Nothing here imports the runtime's other modules: they are given their steps and
the ``arm`` callable.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

Step = Callable[[], None]


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


class BackwardPass:
    """One engine callback per backward pass, running ``end`` in order; ``begin`` runs when the pass is armed."""

    def __init__(self, begin: Sequence[Step] = (), end: Sequence[Step] = ()) -> None:
        self.begin, self.end = list(begin), list(end)
        self.armed = False

    def arm(self) -> None:
        """Called from inside a backward pass: on the pass's first call run ``begin`` and queue ``end``."""
        if self.armed or not in_backward():
            return
        self.armed = True
        for step in self.begin:
            step()
        torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _finish(self) -> None:
        try:
            for step in self.end:
                step()
        finally:
            self.armed = False


__all__ = ["BackwardPass", "in_backward"]
