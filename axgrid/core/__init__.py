"""The core every parallelism builds on, and the runtime that wires them.

==============  ===================================================================================================
:mod:`.grid`    :class:`Grid`: the topology (groups of a Gx x Gy x Gz x Gd grid) and the communicator; ``axgrid.init``
:mod:`.comm`    :class:`Communicator`: the one communication entry point, with its timeout and its ledger
:mod:`.config`  :class:`RuntimeConfig`, :class:`OverlapConfig`: what a runtime is configured with, as objects
:mod:`.backward`  :class:`BackwardPass`: whether a backward is running, and the one end of the backward
:mod:`.runtime`  :class:`Runtime`: builds the device, the groups, and wires the rooms (tensor parallelism's weight
                source and gradient sink, data parallelism's buckets) into the end of the backward
==============  ===================================================================================================

The rooms (:mod:`axgrid.tensor_parallel`, :mod:`axgrid.data_parallel`, and the context- and expert-parallel rooms
when they come) import the core and never each other; only :mod:`.runtime` imports the rooms. This ``__init__``
imports nothing, so that ``axgrid.core.grid`` loads no machinery.
"""
