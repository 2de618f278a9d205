"""Tensor parallelism over x, y and z: Agarwal's 3D parallel matrix multiplication and everything only it needs.

=====================  ============================================================================================
:mod:`.linear`          the 3D ``Linear`` (``axgrid.nn.Linear``): ``Y = AR_x(X_loc · AG_z(W_shard)ᵀ)`` and its backward
:mod:`.redistribute`    moving activations between layouts (tokens over d·z, features over x or y)
:mod:`.overlap`         the weight gather and its prefetch (OAG), the reduce-scatter pipeline of gradients (ORS)
:mod:`.replicated_grad`  gradients of parameters replicated over a tensor-parallel letter
:mod:`.vocab_parallel`  the cross-entropy of a vocabulary split over a letter, without gathering the logits
:mod:`.layernorm`, :mod:`.rmsnorm`  norms over features split over a letter
:mod:`.embedding`, :mod:`.tied_embedding`  embeddings with the table split, and tied to the output layer
=====================  ============================================================================================

A room: it imports :mod:`axgrid.core` and the shared packages below it, never another room
(``tests/unit/test_import_graph.py``); :mod:`axgrid.core.runtime` wires it. This ``__init__`` imports nothing.
"""
