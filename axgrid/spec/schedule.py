"""The constants of the overlap schedule, shared by the runtime (:mod:`axgrid.overlap`, :class:`axgrid.RuntimeConfig`)
and the performance model that replays it (``perfmodel.gpt``, ``perfmodel.comm``).

- ORS: each gradient collective (a weight's ``RS_z``, a bias' or layer norm's ``AR_z``) is posted
  asynchronously; once more than :data:`GRADIENT_WINDOW` are in flight the oldest is completed, so a gradient
  becomes final :data:`GRADIENT_WINDOW` posts after its own (or at the end of the backward).
- Data parallel: gradients are reduced over d in buckets of :data:`DEFAULT_BUCKET_BYTES` unless configured
  (:mod:`axgrid.spec.buckets`); with ``zero=2`` and ODP at most :data:`GRADIENT_WINDOW` bucket reduce-scatters
  are in flight before the oldest is completed.
"""
from __future__ import annotations

#: Gradient collectives the ORS pipeline keeps in flight before completing the oldest.
GRADIENT_WINDOW = 2

#: Default size of a data-parallel gradient bucket (``RuntimeConfig.bucket_bytes``, ``perfmodel.Options``): 25 MiB.
DEFAULT_BUCKET_BYTES = 25 * 2**20
