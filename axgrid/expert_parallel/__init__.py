"""Expert parallelism: a mixture-of-experts block whose experts are spread over the expert-parallel group ``"e"`` (ranks
of one x·y·z position inside d, :mod:`axgrid.spec.layout`), each expert's FC layers 3D Linear layers over x, y, z.

- :mod:`.router`: the top-k router over the sharded stream (its logits all-reduced over x), the scores as the model's
  config says (softmax or sigmoid, top-k weights normalised or not);
- :mod:`.dispatch`: tokens to their experts' ranks and back, all-to-all of uneven sizes over ``"e"`` (dropless);
- :mod:`.moe`: the block: route, dispatch, run this rank's experts, combine; its refusals (one line, before any
  collective).

The expert gradients reduce over the expert-replica group ``"r"`` only (:mod:`axgrid.data_parallel.gradients`).
docs/design.md#expert-parallelism says why the experts live in d.
"""
from .moe import ExpertParallelMoE, check_moe
from .router import TopKRouter

__all__ = ["ExpertParallelMoE", "TopKRouter", "check_moe"]
