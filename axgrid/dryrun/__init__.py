"""The dry run: one rank of a job of any size, on this machine, with the real runtime, against perfmodel.

=================  ===================================================================================
:mod:`.harness`    the fake GPU: fake tensors on a "fakegpu" (or fake ``cuda``) device, torch's fake process
                   group, the watch on host traffic (:func:`~.harness.dry_run`)
:mod:`.config`     what to run (torch-free): the checked configuration, perfmodel's best grid by default, the
                   valid grids named on bad input, perfmodel's prediction of memory and collectives
:mod:`.step`       one rank's real training step (forward, backward, gradient sync, clipping, AdamW), measured
                   by ``axgrid.metrics.memtrack`` and the ledger
:mod:`.report`     the figures beside perfmodel's, their differences, the JSON document
:mod:`.cli`        ``python -m axgrid.dryrun`` / ``axgrid dryrun``
=================  ===================================================================================

Importing this package loads neither torch nor the runtime.
"""
from .config import DryRunConfig, DryRunError, Prediction, predict, resolve, role_ranks

__all__ = ["DryRunConfig", "DryRunError", "Prediction", "predict", "resolve", "role_ranks"]
