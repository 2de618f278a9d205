"""Context parallelism: the tokens of one sequence split over the ranks of the group ``"c"`` (``axgrid.init(...,
cp=N)``; a split of the tokens z and d already shard, :mod:`axgrid.spec.layout`), each holding two chunks from both
ends of the sequence (:mod:`.chunks`), attention exchanging keys and values between them (all-gathered,
:mod:`.attention`, or passed around a ring, :mod:`.ring`), the loss and its normaliser summed over the whole
sequence (:mod:`.loss`). docs/design.md#context-parallelism says where it lives and why."""
from .attention import EXCHANGES, context_parallel_attention
from .chunks import check_sequence, chunk_ids, positions, sample_spans, shard, unshard
from .loss import whole_sequence_mean
from .ring import ring_attention

__all__ = ["EXCHANGES", "context_parallel_attention", "ring_attention", "check_sequence", "chunk_ids", "positions", "sample_spans",
           "shard", "unshard", "whole_sequence_mean"]
