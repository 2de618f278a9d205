"""Running real ranks for tests and benchmarks, on one machine.

=================  ===================================================================================
:mod:`.pool`       :class:`RankPool`: a function on N real gloo ranks from a forkserver with torch preloaded,
                   reused across calls (what the multi-rank tests and the benchmarks run on)
:mod:`.faults`     one fault-injection job (:mod:`.fault_rank` on 2 ranks) under a launcher, its teardown timed
:mod:`.slurm`      a private one-node Slurm cluster (slurmctld, slurmd, munge) under a folder of its own
=================  ===================================================================================
"""
from .pool import RankFailure, RankPool

__all__ = ["RankFailure", "RankPool"]
