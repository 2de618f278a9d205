"""Measuring this machine on real ranks, for the performance model and the benchmarks.

===================  =================================================================================
:mod:`.collectives`  every collective over each (group size, stride), and GEMMs on every rank at once
:mod:`.steps`        seconds per training step of the configurations ``perfmodel validate`` picks
:mod:`.cli`          ``python -m axgrid.measure collectives|steps``: the JSON ``perfmodel`` reads
:mod:`.harness`      the benchmarks' timing: configurations interleaved in shuffled rounds, ratios within a round
===================  =================================================================================
"""
