"""Context parallelism: the tokens of one sequence split over the ranks of the group ``"c"`` (``axgrid.init(...,
cp=N)``; a split of the tokens z and d already shard, :mod:`axgrid.spec.layout`), each holding two chunks from both
ends of the sequence (:mod:`.chunks`), attention exchanging keys and values between them (all-gathered, :mod:`.attention`, or around a ring,
:mod:`.ring`), the
loss and its normaliser summed over the whole sequence (:mod:`.loss`)."""
from .attention import EXCHANGES, context_parallel_attention
from .ring import ring_attention
from .chunks import check_sequence, chunk_ids, positions, shard, unshard
from .loss import whole_sequence_mean

__all__ = ["EXCHANGES", "context_parallel_attention", "ring_attention", "check_sequence", "chunk_ids", "positions", "shard", "unshard",
           "whole_sequence_mean"]
