"""The overlap schedule, shared by the runtime (:mod:`axgrid.tensor_parallel.overlap`, :class:`axgrid.RuntimeConfig`),
the performance model that replays it (``perfmodel.step``, ``perfmodel.comm``) and the dry run: its switches
(:class:`OverlapConfig`, and the one parser of ``--overlap``) and constants.

- ORS: each gradient collective (a weight's ``RS_z``, a bias' or layer norm's ``AR_z``) is posted
  asynchronously; once more than :data:`GRADIENT_WINDOW` are in flight the oldest is completed, so a gradient
  becomes final :data:`GRADIENT_WINDOW` posts after its own (or at the end of the backward).
- Data parallel: gradients are reduced over d in buckets of :data:`DEFAULT_BUCKET_BYTES` unless configured
  (:mod:`axgrid.spec.buckets`); with ``zero=2`` and ODP at most :data:`GRADIENT_WINDOW` bucket reduce-scatters
  are in flight before the oldest is completed.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Gradient collectives the ORS pipeline keeps in flight before completing the oldest.
GRADIENT_WINDOW = 2

#: Default size of a data-parallel gradient bucket (``RuntimeConfig.bucket_bytes``, ``perfmodel.Options``): 25 MiB.
DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class OverlapConfig:
    """Which collectives run asynchronously under compute. Results are identical with any combination.

    - ``oar``: in backward, the input-gradient all-reduce runs under the weight-gradient GEMM.
    - ``ors``: the weight-gradient reduce-scatter over z runs under the backward of earlier layers.
    - ``oag``: the next layer's weight all-gather over z is prefetched in forward execution order.
    - ``odp``: the data-parallel all-reduce over d is bucketed and runs under the backward.
    - ``keep_gathered_weights``: keep the forward's gathered weights for backward (one all-gather fewer,
      more memory).
    """

    oar: bool = False
    ors: bool = False
    oag: bool = False
    odp: bool = False
    keep_gathered_weights: bool = False

    @staticmethod
    def parse(spec: str) -> OverlapConfig:
        """``"oar,ors"`` / ``"all"`` / ``"none"`` -> OverlapConfig."""
        names = {"oar", "ors", "oag", "odp"}
        spec = spec.strip().lower()
        if spec in ("", "none", "off"):
            return OverlapConfig()
        chosen = {s.strip() for s in spec.split(",") if s.strip()}
        if "all" in chosen:
            chosen = (chosen - {"all"}) | names
        unknown = chosen - names - {"keep"}
        if unknown:
            raise ValueError(f"unknown overlap switch(es) {sorted(unknown)}; choose from oar, ors, oag, odp, keep, "
                             f"all, none")
        return OverlapConfig(**{n: n in chosen for n in names}, keep_gathered_weights="keep" in chosen)
