"""Context parallelism: the tokens of one sequence split over the ranks of the group ``"c"`` (``axgrid.init(...,
cp=N)``; a split of the tokens z and d already shard, :mod:`axgrid.spec.layout`), each holding two chunks from both
ends of the sequence (:mod:`.chunks`), attention exchanging keys and values between them (:mod:`.attention`), the
loss and its normaliser summed over the whole sequence (:mod:`.loss`)."""
from .attention import context_parallel_attention
from .chunks import check_sequence, chunk_ids, positions, shard, unshard
from .loss import whole_sequence_mean

__all__ = ["context_parallel_attention", "check_sequence", "chunk_ids", "positions", "shard", "unshard",
           "whole_sequence_mean"]
