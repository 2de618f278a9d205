"""Data parallelism over d, with DDP's semantics, and sharding over d (ZeRO 1 and 2).

=========================  ========================================================================================
:mod:`.gradients`           :class:`DataParallel` (the runtime's part that owns the buckets), ``sync_gradients``,
                            ``no_sync``, the global gradient norm and clipping, ``local_batch``
:mod:`.buckets`             the buckets that are the gradients, and their collectives over d (overlapped: ODP)
:mod:`.sharded_optimizer`   optimizer state (``zero=1``) and gradients (``zero=2``) sharded over d
:mod:`.replicas`            replicated parameters stay replicas: the fingerprint check and the repair
=========================  ========================================================================================

A room: it imports :mod:`axgrid.core` and the shared packages below it, never another room
(``tests/unit/test_import_graph.py``); :mod:`axgrid.core.runtime` wires it. This ``__init__`` imports nothing.
"""
